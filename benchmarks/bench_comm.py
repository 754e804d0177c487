"""`make bench`: ringzero's ring against the backend's all-reduce, and `auto` against the fastest.

On `--nproc` local ranks (4), over `--transport` (shm, the default transport's choice on one host):

1. ring all-reduce busbw against the backend's own C++ all_reduce (algorithm "torch") for 1..64 MiB,
   the median of `--ring-reps` repetitions each, interleaved; the ratio per size.
2. calibration, exactly as a user runs it: `ringzero bench comm --nproc N --calibrate --transport T`
   into a temporary file, timed (goal: under 60 s).
3. evaluation, a fresh measurement of every algorithm of all-reduce, all-gather and reduce-scatter
   on 2..N ranks, at the calibration's sizes (1 KiB..16 MiB by x4), between them (x2 each side)
   and beyond them (64 MiB), `--reps` repetitions interleaved. In every (collective, world, size)
   cell: the fastest algorithm by median, each algorithm's noise (the half-width of its median's
   95 % interval, 1.57 IQR / sqrt(reps): McGill, Tukey & Larsen 1978), and what `auto` picks with
   the calibration and with the transport's built-in defaults (no file). Per picker: the mean
   regret (its pick's median / the fastest's - 1) and the share of cells within 10 % of the
   fastest, a miss counted only where the gap is larger than the two medians' noise (goals:
   mean regret <= 3 %, >= 95 % of cells; calibrated never worse than uncalibrated). Beside them the
   noise floor: the regret of picking by half of the repetitions and judging by the other half.

Ranks are grouped in emulated nodes of `--ranks-per-node` (2), so `hierarchical` is a real
candidate on 3 and 4 ranks. Results go to `--out`; a summary is printed. Times on a shared 2-core
machine are noisy: read the ratios and the noise beside them, not the absolute numbers.

    .venv/bin/python benchmarks/bench_comm.py [--transport shm|gloo] [--reps 9] [--out out/bench_comm.json]
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

from rich.console import Console
from rich.table import Table

from ringzero.bench.comm import measure
from ringzero.bench.comm_ranks import Job
from ringzero.bench.comm_report import make_console
from ringzero.comm import cost, registry, select

MiB = 1 << 20
WITHIN = 0.10
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
CALIBRATED = [1024 * 4 ** k for k in range(8)]           # --calibrate's sizes, 1 KiB..16 MiB
EVALUATED = sorted({*CALIBRATED, *[2 * s for s in CALIBRATED[:-1]], 64 * MiB})
TARGET_S = 0.02
RINGZERO = str(Path(sys.executable).with_name("ringzero"))


def _job(worlds, cases, sizes, reps, rpn, transport) -> Job:
    return Job(worlds=tuple(worlds), cases=tuple(cases), sizes=tuple(sizes), dtype="float32", iters=reps,
               warmup=2, ranks_per_node=rpn, target_s=TARGET_S, transport=transport)


def ring_vs_torch(nproc: int, reps: int, transport: str) -> list[dict]:
    rows = measure(_job([nproc], [("all_reduce", ("ring", "torch"))], [MiB << k for k in range(7)], reps, None,
                        transport), nproc)
    by = {(r["size"], r["algorithm"]): r for r in rows}
    return [{"size": s, "ring_busbw": by[(s, "ring")]["busbw"], "torch_busbw": by[(s, "torch")]["busbw"],
             "ratio": by[(s, "ring")]["busbw"] / by[(s, "torch")]["busbw"], "wrong": by[(s, "ring")]["wrong"]}
            for s in sorted({s for s, _ in by})]


def calibrate(nproc: int, transport: str, rpn: int, path: Path) -> float:
    """Seconds `ringzero bench comm --calibrate` takes, writing `path`."""
    t0 = time.perf_counter()
    subprocess.run([RINGZERO, "bench", "comm", "--nproc", str(nproc), "--calibrate", "--transport", transport,
                    "--ranks-per-node", str(rpn), "--out", str(path)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _noise(reps_us: list[float]) -> float:
    """Half-width of the median's 95 % interval (McGill, Tukey & Larsen 1978), µs."""
    q = statistics.quantiles(reps_us, n=4)
    return 1.57 * (q[2] - q[0]) / len(reps_us) ** 0.5


def cells(rows: list[dict], pickers: dict) -> list[dict]:
    """Per (collective, world, size): medians, noise, the fastest, each picker's pick, slowdown, miss."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["collective"], r["world"], r["size"]), {})[r["algorithm"]] = r
    out = []
    for (coll, world, size), algs in sorted(by.items()):
        med = {a: r["time_us"] for a, r in algs.items()}
        noise = {a: _noise(r["reps_us"]) for a, r in algs.items()}
        fastest = min(med, key=med.get)
        cell = {"collective": coll, "world": world, "size": size, "time_us": med, "noise_us": noise,
                "fastest": fastest}
        for name, pick in pickers.items():
            alg = pick(coll, world, size)
            slow = med[alg] / med[fastest] - 1
            beyond = med[alg] - med[fastest] > noise[alg] + noise[fastest]
            cell[name] = {"pick": alg, "slowdown": slow, "miss": slow > WITHIN and beyond}
        out.append(cell)
    return out


def split_half(rows: list[dict]) -> float:
    """The noise floor of the mean regret: per cell, the fastest by the odd repetitions' medians,
    its regret by the even ones' (and the other way round): what an oracle that measured each cell
    once, as noisily, would score (the fastest of noisy medians is biased fast: the winner's curse)."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["collective"], r["world"], r["size"]), {})[r["algorithm"]] = r["reps_us"]
    regrets = []
    for algs in by.values():
        for pick_half, judge_half in ((0, 1), (1, 0)):
            pick = {a: statistics.median(reps[pick_half::2]) for a, reps in algs.items()}
            judge = {a: statistics.median(reps[judge_half::2]) for a, reps in algs.items()}
            regrets.append(judge[min(pick, key=pick.get)] / min(judge.values()) - 1)
    return statistics.fmean(regrets)


def summary(cs: list[dict], name: str) -> dict:
    slow = [c[name]["slowdown"] for c in cs]
    return {"mean_regret": statistics.fmean(slow), "within": sum(not c[name]["miss"] for c in cs) / len(cs),
            "within_strict": sum(s <= WITHIN for s in slow) / len(cs)}


def run(args, console: Console) -> dict:
    t0, rpn, transport = time.time(), args.ranks_per_node, args.transport
    worlds = range(2, args.nproc + 1)
    console.print(f"[bold]1/3[/bold] ring vs torch all-reduce on {args.nproc} ranks ({transport}) ...")
    rvt = ring_vs_torch(args.nproc, args.ring_reps, transport)
    console.print("[bold]2/3[/bold] ringzero bench comm --calibrate ...")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calibration.json"
        cal_s = calibrate(args.nproc, transport, rpn, path)
        cal = cost.load(path, transport)
    console.print(f"[bold]3/3[/bold] every algorithm of {', '.join(COLLECTIVES)} again, {len(EVALUATED)} sizes, "
                  f"worlds 2..{args.nproc}, {args.reps} repetitions ...")
    cases = [(c, tuple(registry.algorithms(c))) for c in COLLECTIVES]
    rows = measure(_job(worlds, cases, EVALUATED, args.reps, rpn, transport), args.nproc)

    def node(w):
        return max(1, min(rpn or w, w))
    pickers = {"calibrated": lambda c, w, s: select.best(c, w, s, node(w), cal, transport),
               "defaults": lambda c, w, s: select.best(c, w, s, node(w), None, transport)}
    cs = cells(rows, pickers)
    return {"nproc": args.nproc, "transport": transport, "ranks_per_node": rpn, "reps": args.reps,
            "ring_vs_torch": rvt, "calibration_s": cal_s, "calibration": cal.to_json(), "cells": cs,
            "summary": {k: summary(cs, k) for k in pickers},
            "noise_median": statistics.median(c["noise_us"][c["fastest"]] / c["time_us"][c["fastest"]] for c in cs),
            "split_half_regret": split_half(rows),
            "wrong": sum(r["wrong"] for r in rows) + sum(r["wrong"] for r in rvt),
            "rows": rows, "seconds": time.time() - t0}


def _print(console: Console, result: dict) -> None:
    t = Table(title=f"ring all-reduce vs the backend's all_reduce (busbw, GB/s), transport {result['transport']}",
              title_justify="left")
    for col in ("size", "ring", "torch", "ring/torch"):
        t.add_column(col, justify="right")
    for r in result["ring_vs_torch"]:
        t.add_row(f"{r['size'] // MiB} MiB", f"{r['ring_busbw']:.3f}", f"{r['torch_busbw']:.3f}", f"{r['ratio']:.2f}")
    console.print(t)
    console.print(f"calibration: {result['calibration_s']:.1f} s (goal < 60 s); model fit error median "
                  f"{result['calibration']['error']['median']:.1%} over {result['calibration']['error']['rows']} rows")
    t = Table(title="cells where a pick misses (slower by > 10 % and by more than the noise)", title_justify="left")
    for col in ("collective", "ranks", "size", "fastest", "calibrated", "defaults"):
        t.add_column(col, justify="right")
    for c in result["cells"]:
        if c["calibrated"]["miss"] or c["defaults"]["miss"]:
            t.add_row(c["collective"], str(c["world"]), f"{c['size'] // 1024} KiB", c["fastest"],
                      *(f"{c[k]['pick']} +{c[k]['slowdown']:.0%}" + (" ✗" if c[k]["miss"] else "")
                        for k in ("calibrated", "defaults")))
    console.print(t)
    n = len(result["cells"])
    for name, s in result["summary"].items():
        console.print(f"{name:>10}: mean regret {s['mean_regret']:.1%}; within 10 % (beyond noise) in {s['within']:.1%} "
                      f"of {n} cells; within 10 % outright in {s['within_strict']:.1%}")
    console.print(f"noise floor: the fastest's median is known to ±{result['noise_median']:.1%} (median over cells); "
                  f"picking by one half of the repetitions and judging by the other scores a mean regret of "
                  f"{result['split_half_regret']:.1%}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--transport", default="shm", choices=("shm", "gloo"))
    p.add_argument("--ring-reps", type=int, default=9, help="repetitions of ring vs torch (median)")
    p.add_argument("--reps", type=int, default=9, help="timed repetitions per evaluated cell (median)")
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--out", default="out/bench_comm.json")
    args = p.parse_args(argv)
    console = make_console()
    result = run(args, console)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    _print(console, result)
    console.print(f"wrote {out} ({result['seconds']:.0f} s)")
    if result["wrong"]:
        console.print(f"[red]{result['wrong']} wrong elements[/red]")
    return 1 if result["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
