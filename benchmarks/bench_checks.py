"""What the metadata handshake (`CommConfig.checks`) costs per collective call.

On 2 and 4 local gloo ranks (`ringzero.launch.spawn`), an all_reduce of 4 KiB and of 1 MiB is
timed with checks off and on. The two settings are interleaved, their order alternating from one
repetition to the next, so that drift of a shared machine hits both alike. Each repetition times
`--inner` back-to-back calls after a barrier; its time is the slowest rank's, and a cell's time is
the median over repetitions. Printed per cell: both times, their ratio, and their difference (the
handshake's own cost: one backend all-gather of a few integers plus its Python around it).

    python benchmarks/bench_checks.py --reps 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from ringzero import comm, outputs
from ringzero.errors import UsageError
from ringzero.launch import spawn

KiB, MiB = 1 << 10, 1 << 20


def _rank(sizes: list[int], reps: int, warmup: int, inner: int, algorithm: str) -> dict:
    """Per (size, checks): this rank's seconds per call in each repetition after the warm-up."""
    bufs = {size: torch.zeros(size // 4) for size in sizes}  # zeros: sums stay finite
    times: dict = {(size, on): [] for size in sizes for on in (False, True)}
    for rep in range(warmup + reps):
        for size in sizes:
            for on in ((False, True) if rep % 2 else (True, False)):
                with comm.configure(checks=on):
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        comm.all_reduce(bufs[size], algorithm=algorithm)
                    dt = (time.perf_counter() - t0) / inner
                if rep >= warmup:
                    times[(size, on)].append(dt)
    return {f"{size}/{int(on)}": v for (size, on), v in times.items()}


def measure(world: int, sizes: list[int], reps: int, warmup: int, inner: int, algorithm: str) -> list[dict]:
    per_rank = spawn(_rank, world, args=(sizes, reps, warmup, inner, algorithm))
    rows = []
    for size in sizes:
        # a repetition lasts as long as its slowest rank
        med = {on: statistics.median(max(ts) for ts in zip(*(r[f"{size}/{int(on)}"] for r in per_rank)))
               for on in (False, True)}
        rows.append({"world": world, "bytes": size, "off_us": med[False] * 1e6, "on_us": med[True] * 1e6,
                     "ratio": med[True] / med[False], "handshake_us": (med[True] - med[False]) * 1e6})
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="ranks per run (default 2 4)")
    p.add_argument("--reps", type=int, default=200, help="timed repetitions per cell (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="untimed repetitions first (default 10)")
    p.add_argument("--inner", type=int, default=5, help="calls per timed repetition (default 5)")
    p.add_argument("--algorithm", default="ring", help="all_reduce algorithm (default ring)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    if args.json:                      # before the measurement, not after it
        try:
            outputs.check(args.json, "--json")
        except UsageError as e:
            p.error(str(e))
    rows = [row for world in args.worlds
            for row in measure(world, [4 * KiB, MiB], args.reps, args.warmup, args.inner, args.algorithm)]
    print(f"all_reduce/{args.algorithm}, median of {args.reps} interleaved repetitions of {args.inner} calls")
    print(f"{'ranks':>5} {'size':>8} {'off µs':>9} {'on µs':>9} {'on/off':>7} {'handshake µs':>13}")
    for r in rows:
        size = f"{r['bytes'] // MiB} MiB" if r["bytes"] >= MiB else f"{r['bytes'] // KiB} KiB"
        print(f"{r['world']:>5} {size:>8} {r['off_us']:>9.1f} {r['on_us']:>9.1f} {r['ratio']:>7.2f} "
              f"{r['handshake_us']:>13.1f}")
    if args.json:
        outputs.write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
