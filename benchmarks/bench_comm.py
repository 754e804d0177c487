"""`make bench`: ringzero's ring against the backend's all-reduce, and `auto` against the fastest.

On 4 local gloo ranks, in one run:

1. ring all-reduce busbw against the backend's own C++ all_reduce (algorithm "torch") for
   1..64 MiB, the median of `--ring-reps` repetitions each, interleaved; the ratio per size.
2. calibration: every all-reduce algorithm on 2, 3 and 4 ranks, 1 KiB..16 MiB by powers of 2,
   `--cal-reps` repetitions, fitted by `ringzero.comm.cost.fit` into a temporary calibration file
   (what `ringzero bench comm --calibrate` does).
3. evaluation, a fresh measurement with `--reps` repetitions on 2, 3 and 4 ranks, 1 KiB..16 MiB by
   powers of 4: in every (size, world) cell the fastest algorithm and the one `algorithm="auto"`
   picks under that calibration. Fewer sizes than the calibration but many more repetitions: on
   this machine one repetition varies by ~30 %, and algorithms that move the same bytes in the
   same rounds (naive, tree and butterfly on 2 ranks) can only be told apart within 10 % by the
   median of many. The goal is auto within 10 % of the fastest in >= 95 % of the cells. The same
   fraction is reported for the shared model alone (one α, β, γ) and for the built-in defaults
   (no calibration file), and, as the noise floor, for an oracle that picks each cell's fastest
   algorithm of the calibration run.

Ranks are grouped in emulated nodes of `--ranks-per-node` (2) so `hierarchical` is a real
candidate on 3 and 4 ranks. Results go to out/bench_comm.json; a summary is printed. Times on a
shared 2-core machine are noisy: read the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ringzero.bench.comm import measure
from ringzero.bench.comm_ranks import Job
from ringzero.bench.comm_report import describe_model, make_console
from ringzero.comm import cost, registry, select
from ringzero.comm.cost import Calibration

MiB = 1 << 20
WITHIN = 0.10


TARGET_S = 0.02


def _job(worlds, algorithms, sizes, reps, rpn) -> Job:
    return Job(worlds=tuple(worlds), cases=(("all_reduce", tuple(algorithms)),), sizes=tuple(sizes),
               dtype="float32", iters=reps, warmup=2, ranks_per_node=rpn, target_s=TARGET_S)


def ring_vs_torch(nproc: int, reps: int) -> list[dict]:
    rows = measure(_job([nproc], ["ring", "torch"], [MiB << k for k in range(7)], reps, None), nproc)
    by = {(r["size"], r["algorithm"]): r for r in rows}
    return [{"size": s, "ring_busbw": by[(s, "ring")]["busbw"], "torch_busbw": by[(s, "torch")]["busbw"],
             "ratio": by[(s, "ring")]["busbw"] / by[(s, "torch")]["busbw"], "wrong": by[(s, "ring")]["wrong"]}
            for s in sorted({s for s, _ in by})]


def _node(rpn: int | None, n: int) -> int:
    return max(1, min(rpn or n, n))


def _times(rows: list[dict]) -> dict[tuple[int, int], dict[str, float]]:
    """(world, size) -> {algorithm: median µs}."""
    cells: dict[tuple[int, int], dict[str, float]] = {}
    for r in rows:
        cells.setdefault((r["world"], r["size"]), {})[r["algorithm"]] = r["time_us"]
    return cells


def auto_cells(rows: list[dict], pickers: dict) -> list[dict]:
    """Per (world, size): measured times, the fastest, and each picker's choice and slowdown."""
    out = []
    for (world, size), times in sorted(_times(rows).items()):
        fastest = min(times, key=times.get)
        cell = {"world": world, "size": size, "times_us": times, "fastest": fastest}
        for name, pick in pickers.items():
            alg = pick(world, size)
            cell[name] = {"pick": alg, "slowdown": times[alg] / times[fastest] - 1}
        out.append(cell)
    return out


def pickers(cal: Calibration, cal_rows: list[dict], rpn: int | None) -> dict:
    """`auto` as the library runs it, the shared model alone, the defaults, and the noise floor."""
    shared = Calibration(model=cal.model, overlap={k: v for k, v in cal.overlap.items() if k == "shared"})
    before = _times(cal_rows)
    return {
        "auto": lambda w, s: select.choose("all_reduce", w, s, _node(rpn, w)),
        "shared": lambda w, s: select.best("all_reduce", w, s, _node(rpn, w), shared),
        "default": lambda w, s: select.best("all_reduce", w, s, _node(rpn, w), None),
        "oracle": lambda w, s: min(before[(w, s)], key=before[(w, s)].get),
    }


def fraction(cells: list[dict], name: str) -> float:
    return sum(c[name]["slowdown"] <= WITHIN for c in cells) / len(cells)


def _print(console: Console, result: dict) -> None:
    t = Table(title="ring all-reduce vs the backend's all_reduce (busbw, GB/s)", title_justify="left")
    for col in ("size", "ring", "torch", "ring/torch"):
        t.add_column(col, justify="right")
    for r in result["ring_vs_torch"]:
        t.add_row(f"{r['size'] // MiB} MiB", f"{r['ring_busbw']:.3f}", f"{r['torch_busbw']:.3f}",
                  f"{r['ratio']:.2f}")
    console.print(t)
    cal = result["calibration"]
    console.print(f"calibration (shared model): {describe_model(Calibration.from_json(cal).model)}")
    console.print(f"  own models kept (cross-validated): {', '.join(cal['per_algorithm']) or 'none'}")
    console.print(f"  fit error per-algorithm models: median {cal['error']['median']:.1%}, max "
                  f"{cal['error']['max']:.1%}; shared model: median {cal['error']['shared']['median']:.1%}, "
                  f"max {cal['error']['shared']['max']:.1%}")
    t = Table(title="all-reduce: fastest measured vs auto's pick", title_justify="left")
    for col in ("ranks", "size", "fastest", "auto", "auto slower by"):
        t.add_column(col, justify="right")
    for c in result["cells"]:
        slow = c["auto"]["slowdown"]
        t.add_row(str(c["world"]), f"{c['size'] // 1024} KiB", c["fastest"], c["auto"]["pick"],
                  f"{slow:.1%}", style=None if slow <= WITHIN else "red")
    console.print(t)
    labels = {"auto": "auto (calibrated, per-algorithm models)", "shared": "the shared α-β-γ model alone",
              "default": "the built-in defaults (no calibration)",
              "oracle": "the calibration run's fastest (noise floor)"}
    for name, label in labels.items():
        console.print(f"within {WITHIN:.0%} of the fastest in {result['fraction'][name]:.1%} of "
                      f"{len(result['cells'])} (size, world) cells: {label}")
    big = [r["ratio"] for r in result["ring_vs_torch"] if r["size"] >= 4 * MiB]
    console.print(f"ring/torch busbw for >= 4 MiB: min {min(big):.2f}, median {statistics.median(big):.2f}")


def run(args, console: Console) -> dict:
    """The three measurements and their analysis, as plain data."""
    t0, phases = time.time(), {}
    worlds, rpn = range(2, args.nproc + 1), args.ranks_per_node
    algs = registry.algorithms("all_reduce")
    console.print(f"[bold]1/3[/bold] ring vs torch all-reduce on {args.nproc} ranks ...")
    rvt = ring_vs_torch(args.nproc, args.ring_reps)
    phases["ring_vs_torch"] = time.time() - t0
    sizes = [1024 << k for k in range(15)]
    console.print("[bold]2/3[/bold] calibrating (all-reduce, 1 KiB..16 MiB, worlds 2..4) ...")
    cal_rows = measure(_job(worlds, algs, sizes, args.cal_reps, rpn), args.nproc)
    cal = cost.fit(cal_rows, meta={"nproc": args.nproc, "worlds": list(worlds), "ranks_per_node": rpn})
    phases["calibration"] = time.time() - t0 - sum(phases.values())
    console.print("[bold]3/3[/bold] measuring every algorithm again, 1 KiB..16 MiB by x4, worlds 2..4 ...")
    rows = measure(_job(worlds, algs, sizes[::2], args.reps, rpn), args.nproc)
    phases["evaluation"] = time.time() - t0 - sum(phases.values())
    with tempfile.TemporaryDirectory() as tmp:  # auto reads this run's calibration, not ~/.cache's
        os.environ["RINGZERO_CALIBRATION"] = str(cost.save(cal, Path(tmp) / "calibration.json"))
        cells = auto_cells(rows, pickers(cal, cal_rows, rpn))
        del os.environ["RINGZERO_CALIBRATION"]
    return {
        "nproc": args.nproc, "ranks_per_node": rpn, "reps": args.reps,
        "ring_vs_torch": rvt, "calibration": cal.to_json(), "cells": cells,
        "fraction": {k: fraction(cells, k) for k in ("auto", "shared", "default", "oracle")},
        "wrong": sum(r["wrong"] for r in rows + cal_rows) + sum(r["wrong"] for r in rvt),
        "calibration_rows": cal_rows, "rows": rows, "seconds": time.time() - t0, "phase_seconds": phases,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--ring-reps", type=int, default=9, help="repetitions of ring vs torch (median)")
    p.add_argument("--reps", type=int, default=41, help="timed repetitions per evaluated cell (median)")
    p.add_argument("--cal-reps", type=int, default=7, help="repetitions per cell when calibrating")
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
