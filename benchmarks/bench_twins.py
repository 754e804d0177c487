"""How far `ringzero train`'s step-time prediction is from its measurement, over repeated runs.

Runs each configuration `--repeat` times through the CLI (`ringzero train ... --json-report`) on 2
and on 4 local ranks and prints, per configuration, the min / median / max over the runs of the
error (measured - predicted) / predicted (+: slower than predicted) of the step time, compute and
exposed communication, and of the step as the simulator plays it (`ringzero simulate`'s events
with the run's probed rates: `twin.simulated`), beside the median spread of the step time the in-run probes predicted
((max - min) / median over a run's probe points: how much the machine's load moved during a run)
and the median share of the run the probes took. The configurations: data parallelism, ZeRO-1 in
fp16 (16-bit arithmetic runs ~20x slower than fp32 on a CPU without native support, so a smaller
micro-batch and sequence), ZeRO-2 with selective recomputation (`make run`), and ZeRO-3 in fp32
and in bf16 (`--nprocs 3` puts three ranks on a 2-core machine: two share a core at any moment).

    python benchmarks/bench_twins.py                          # the README's table (a quiet machine)
    python benchmarks/bench_twins.py --repeat 1 --steps 20    # a quick look

Writes every run's report to --out (one JSON with the command lines that reproduce them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "dp": ["--strategy", "dp", "--micro-batch", "4"],
    "zero1-fp16": ["--strategy", "zero1", "--precision", "fp16", "--micro-batch", "1", "--seq", "64"],
    "zero2-selective": ["--strategy", "zero2", "--recompute", "selective", "--micro-batch", "4"],
    "zero3": ["--strategy", "zero3", "--micro-batch", "4"],
    "zero3-bf16": ["--strategy", "zero3", "--precision", "bf16", "--micro-batch", "4"],
    "dp-fp16-compress": ["--strategy", "dp", "--micro-batch", "4", "--compress", "fp16", "--compress-start", "2"],
    "dp-powersgd": ["--strategy", "dp", "--micro-batch", "4", "--compress", "powersgd", "--compress-start", "2"],
    "zero1-topk": ["--strategy", "zero1", "--micro-batch", "4", "--compress", "topk", "--compress-start", "2"],
}
TWINS = {"step": "step time", "compute": "compute per step", "comm": "exposed communication per step",
         "simulated": "step time, simulated (the step's events played)"}
"""The twins whose errors are summarized; the simulated step (`twin.simulated`) is absent where the
simulator does not play the run (gradient compression): nan there."""
CLI = "import sys; from ringzero.cli import main; sys.exit(main())"


def run_once(nproc: int, args: list[str], steps: int, folder: Path, label: str) -> tuple[list[str], dict]:
    """One `ringzero train` run; returns (its command line, its JSON report)."""
    out = folder / f"{label}.json"
    cmd = ["ringzero", "train", "--nproc", str(nproc), *args, "--steps", str(steps), "--quiet",
           "--json-report", str(out)]
    done = subprocess.run([sys.executable, "-c", CLI, *cmd[1:]], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return cmd, json.loads(out.read_text())


def errors(report: dict) -> dict[str, float]:
    """The run's errors of `TWINS`, its probes' step-time spread and cost share."""
    twins, probes = report["twins"], report["probes"]
    out = {k: twins[name]["error"] if name in twins else float("nan") for k, name in TWINS.items()}
    out["probe_spread"] = probes["spread"].get("step", {}).get("spread", float("nan"))
    out["probe_cost"] = probes["cost_fraction"]
    return out


def summarize(runs: list[dict]) -> dict[str, dict[str, float]]:
    """min / median / max over runs of each error, the medians of the probes' spread and cost."""
    out = {}
    for k in TWINS:
        xs = [r[k] for r in runs if r[k] == r[k]]          # nan: no such twin in the run
        out[k] = {"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else \
            dict.fromkeys(("min", "median", "max"), float("nan"))
    for k in ("probe_spread", "probe_cost"):
        out[k] = {"median": statistics.median(r[k] for r in runs)}
    return out


def table(rows: dict[str, dict]) -> str:
    head = (f"{'configuration':24s} {'runs':>4s}  " + "  ".join(f"{TWINS[k]:>28s}" for k in TWINS)
            + f"  {'probe spread':>12s} {'probe cost':>10s}")
    lines = [head, " " * 31 + "  ".join(f"{'min / median / max':>28s}" for _ in TWINS)]
    for label, (n, s) in rows.items():
        cells = "  ".join(f"{s[k]['min']:+8.1%} {s[k]['median']:+8.1%} {s[k]['max']:+8.1%}".rjust(28) for k in TWINS)
        lines.append(f"{label:24s} {n:4d}  {cells}  {s['probe_spread']['median']:12.0%} "
                     f"{s['probe_cost']['median']:10.1%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", default="2,4", help="comma list of rank counts (default 2,4)")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration (default 3)")
    p.add_argument("--steps", type=int, default=200, help="steps per run (default 200, as make run)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--out", default="out/bench_twins.json")
    args = p.parse_args(argv)
    names = args.configs.split(",")
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or args.repeat < 1 or args.steps < 1:
        p.error(f"unknown configurations {unknown}" if unknown else "--repeat and --steps must be >= 1")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows, record, t0 = {}, [], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in (int(n) for n in args.nprocs.split(",")):
            for name in names:
                label, runs = f"{name} x{nproc}", []
                for i in range(args.repeat):
                    cmd, report = run_once(nproc, CONFIGS[name], args.steps, Path(tmp), f"{name}-{nproc}-{i}")
                    runs.append(errors(report))
                    record.append({"configuration": label, "command": " ".join(cmd), "report": report})
                    print(f"{label} run {i + 1}/{args.repeat}: " + ", ".join(
                        f"{k} {v:+.1%}" for k, v in runs[-1].items() if k in TWINS), flush=True)
                rows[label] = (len(runs), summarize(runs))
    print(f"\nerror = (measured - predicted) / predicted (+: slower than predicted), over {args.repeat} "
          f"run(s) of {args.steps} steps each; {time.time() - t0:.0f} s in all")
    print(table(rows))
    Path(args.out).write_text(json.dumps({"runs": record, "summary": {k: s for k, (_, s) in rows.items()}},
                                         indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
