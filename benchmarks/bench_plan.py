"""Speed of `ringzero.plan.search.space`: configurations evaluated per second, and the top 3.

Runs the issue's reference search, llama-2-70b on 1,024 x a100-80gb (default space: DP x TP x PP x
ZeRO 0-3 x micro-batch 1-16 x recomputation x sequence parallelism), and llama-2-7b on 64, each
once "cold" (the first search of that model in this process: it also pays the one-off exact
traffic of each distinct collective, `plan.comm.volume`, cached afterwards) and then `--repeat`
times "warm" (the best of them). Pure Python, single-threaded; on a shared 2-core machine the
figures vary by tens of percent from run to run.

    .venv/bin/python benchmarks/bench_plan.py [--repeat 5] [--json out/bench_plan.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from ringzero.plan.config import Training
from ringzero.plan.hardware import hardware
from ringzero.plan.model.presets import model
from ringzero.plan.search.space import label, search

CASES = (("llama-2-70b", "a100-80gb", 1024), ("llama-2-7b", "a100-80gb", 64))


def run(name: str, gpu: str, gpus: int, repeat: int) -> dict:
    m, hw = model(name), hardware(gpu)
    cold = search(m, Training(), hw, gpus)
    warm = min((search(m, Training(), hw, gpus) for _ in range(repeat)), key=lambda r: r.seconds)
    return {
        "model": name, "gpu": gpu, "gpus": gpus, "global_batch": cold.global_batch,
        "evaluated": cold.evaluated, "fitting": cold.fitting,
        "cold": {"seconds": cold.seconds, "configs_per_s": cold.rate},
        "warm": {"seconds": warm.seconds, "configs_per_s": warm.rate, "repeats": repeat},
        "top": [{"config": label(e), "step_s": e.time.step, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
                 "memory_gb": e.memory.total / 1e9} for e in cold.best[:3]],
        "why": cold.why(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="warm repetitions (default 5)")
    ap.add_argument("--json", metavar="OUT", type=Path, help="also write the results as JSON")
    args = ap.parse_args(argv)
    results = [run(*case, max(1, args.repeat)) for case in CASES]
    for r in results:
        print(f"{r['model']} on {r['gpus']} x {r['gpu']} (global batch {r['global_batch']} sequences): "
              f"{r['evaluated']} configurations evaluated, {r['fitting']} fit")
        for kind in ("cold", "warm"):
            print(f"  {kind}: {r[kind]['seconds']:.3f} s, {r[kind]['configs_per_s']:,.0f} configurations/s")
        for i, t in enumerate(r["top"], 1):
            print(f"  {i}. {t['config']}: {t['step_s']:.3f} s/step, {t['tokens_per_s']:,.0f} tokens/s, "
                  f"MFU {t['mfu']:.1%}, {t['memory_gb']:.1f} GB")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"python": platform.python_version(), "machine": platform.machine(),
                                         "results": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
