"""The simulator against ringzero's own collectives, measured under the link emulator in the same run.

On 8 local gloo ranks, in nodes of `--ranks-per-node` (2):

1. calibration: ring, tree, hierarchical and hierarchical_2d all-reduces on 2, 4 and 8 ranks,
   64 KiB..16 MiB by powers of 2, without the emulator, fitted by `comm.cost.fit` (what
   `ringzero bench comm --calibrate` does): the host's own cost of each algorithm;
2. measurement: the same algorithms at 1, 4 and 16 MiB on 2, 4 and 8 ranks with every message
   between nodes emulated at `--gbps` GB/s and `--latency-us` µs (`comm.link_emulator`);
3. simulation: each measured cell as the calibrated host cost (`comm.select.price`) plus the
   algorithm's schedule played on the emulated NICs (`simulate.local.link_seconds`); the error
   against the measured median.

The goal is every cell within 15 %. Ranks beyond two share this machine's two cores, so 4 and 8
are reported apart from 2. Results go to `--json` (out/bench_simulate_engine.json).

    .venv/bin/python benchmarks/bench_simulate_engine.py [--gbps 1] [--reps 7] [--json ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ringzero.bench.comm import measure
from ringzero.bench.comm_ranks import Job
from ringzero.comm import cost, select
from ringzero.simulate import local

KiB, MiB = 1 << 10, 1 << 20
ALGORITHMS = ("ring", "tree", "hierarchical", "hierarchical_2d")
WITHIN = 0.15


def _job(worlds, sizes, reps, rpn, gbps=None, latency_us=0.0) -> Job:
    return Job(worlds=tuple(worlds), cases=(("all_reduce", ALGORITHMS),), sizes=tuple(sizes), dtype="float32",
               iters=reps, warmup=2, ranks_per_node=rpn, every_algorithm=True, inter_node_gbps=gbps,
               inter_node_latency_us=latency_us)


def run(a) -> dict:
    t0 = time.time()
    worlds = tuple(w for w in (2, 4, 8) if w <= a.nproc)
    cal_rows = measure(_job(worlds, [64 * KiB << k for k in range(9)], a.cal_reps, a.ranks_per_node), a.nproc)
    cal = cost.fit(cal_rows, meta={"worlds": list(worlds), "ranks_per_node": a.ranks_per_node})
    rows = measure(_job(worlds, [MiB, 4 * MiB, 16 * MiB], a.reps, a.ranks_per_node, a.gbps, a.latency_us), a.nproc)
    cells = []
    for r in rows:
        link = local.link_seconds("all_reduce", r["algorithm"], r["world"], r["count"], r["itemsize"],
                                  a.ranks_per_node, a.gbps, a.latency_us)
        host = select.price("all_reduce", r["algorithm"], r["world"], r["count"] * r["itemsize"], a.ranks_per_node, cal)
        sim = host + link
        measured = r["time_us"] * 1e-6
        cells.append({"algorithm": r["algorithm"], "world": r["world"], "bytes": r["count"] * r["itemsize"],
                      "measured_s": measured, "simulated_s": sim, "link_s": link, "error": sim / measured - 1})
    within = {w: _fraction([c for c in cells if c["world"] == w]) for w in worlds}
    return {"gbps": a.gbps, "latency_us": a.latency_us, "ranks_per_node": a.ranks_per_node, "cells": cells,
            "within_15": within, "calibration": cal.to_json(), "seconds": time.time() - t0}


def _fraction(cells: list[dict]) -> float:
    return sum(abs(c["error"]) <= WITHIN for c in cells) / len(cells) if cells else 0.0


def _print(result: dict) -> None:
    print(f"all-reduce under the emulator ({result['gbps']:g} GB/s, {result['latency_us']:g} us, "
          f"{result['ranks_per_node']} ranks per node): measured vs simulated (host calibrated + links played)")
    print(f"{'ranks':>5} {'algorithm':16} {'size':>7} {'measured ms':>12} {'simulated ms':>13} {'of it links':>12} "
          f"{'error':>8}")
    for c in sorted(result["cells"], key=lambda c: (c["world"], c["algorithm"], c["bytes"])):
        mark = "" if abs(c["error"]) <= WITHIN else "  > 15 %"
        print(f"{c['world']:5} {c['algorithm']:16} {c['bytes'] >> 20:5} Mi {c['measured_s'] * 1e3:12.2f} "
              f"{c['simulated_s'] * 1e3:13.2f} {c['link_s'] * 1e3:12.2f} {c['error']:+8.1%}{mark}")
    for w, f in result["within_15"].items():
        print(f"{w} ranks: {f:.0%} of the cells within 15 %")
    print(f"({result['seconds']:.0f} s)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--gbps", type=float, default=1.0)
    p.add_argument("--latency-us", type=float, default=20.0)
    p.add_argument("--reps", type=int, default=7, help="repetitions of each measured cell (median)")
    p.add_argument("--cal-reps", type=int, default=5, help="repetitions of each calibration cell")
    p.add_argument("--json", type=Path, default=Path("out/bench_simulate_engine.json"))
    a = p.parse_args(argv)
    result = run(a)
    _print(result)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
