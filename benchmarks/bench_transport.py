"""The shared-memory transport against gloo, peers in the same run: per-message cost, all-reduce busbw.

- Per-message overhead: a 4-byte ping-pong through `comm.point_to_point` between ranks 0 and 1
  (half the median round trip), on gloo's point-to-point and on shared memory.
- All-reduce: ringzero's ring over shared memory (and over gloo) against gloo's built-in
  `all_reduce` (`torch.distributed.all_reduce`) at 4, 16 and 64 MiB, busbw (nccl-tests' 2(n-1)/n),
  at 2 and 4 ranks. As nccl-tests times them: a repetition is `INNER` calls back to back (the
  slowest rank's time, divided), the peers alternate repetition by repetition so that the machine's
  drift hits each alike, and the median of `--reps` repetitions is reported.
- The same ring on a tensor made by `comm.transport.shared.zeros` ("shm ring, shared"): its
  messages go by reference, the peers reading them in place (nccl-tests' registered buffers,
  `-R 1`; ringzero's data-parallel gradient buckets are such tensors).
- This machine's single-thread memcpy bandwidth (a 64 MiB torch copy on one thread), measured in the
  same run: the ring's busbw is set beside half of it.

    .venv/bin/python benchmarks/bench_transport.py [--ranks 2,4] [--reps 15] [--json out/bench_transport.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from ringzero import comm, launch
from ringzero.comm.point_to_point import post
from ringzero.comm.transport import shared

SIZES = (4 << 20, 16 << 20, 64 << 20)
PINGS = 2000
INNER = {4 << 20: 20, 16 << 20: 10, 64 << 20: 5}
"""Calls per timed repetition (nccl-tests times 20 back to back; fewer at the larger sizes)."""


def memcpy_gbps(nbytes: int = 64 << 20, reps: int = 10) -> float:
    torch.set_num_threads(1)
    a, b = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    b.copy_(a)
    best = min(_timed(lambda: b.copy_(a)) for _ in range(reps))
    return nbytes / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _pingpong(transport: str) -> float | None:
    """Median seconds of one message (half a round trip) between ranks 0 and 1."""
    r, buf = dist.get_rank(), torch.zeros(1)
    times = []
    with comm.configure(transport=transport, checks=False):
        for i in range(PINGS + 200):
            dist.barrier() if i % 500 == 0 else None
            if r == 0:
                t0 = time.perf_counter()
                post(sends=[(1, buf)])[0][0].wait()
                post(recvs=[(1, buf)])[1][0].wait()
                if i >= 200:
                    times.append(time.perf_counter() - t0)
            elif r == 1:
                post(recvs=[(0, buf)])[1][0].wait()
                post(sends=[(0, buf)])[0][0].wait()
    return statistics.median(times) / 2 if r == 0 else None


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _allreduce(nbytes: int, reps: int) -> dict[str, float]:
    """Median seconds (slowest rank) of each peer at `nbytes`."""
    x = torch.randn(nbytes // 4)
    with comm.configure(transport="shm"):
        xs = shared.zeros(nbytes // 4, torch.float32)
    xs.copy_(x)
    runs = {"shm ring": lambda: comm.all_reduce(x, algorithm="ring"),
            "shm ring, shared": lambda: comm.all_reduce(xs, algorithm="ring"),
            "gloo ring": lambda: comm.all_reduce(x, algorithm="ring"),
            "gloo all_reduce": lambda: dist.all_reduce(x)}
    out = {name: [] for name in runs}
    inner = INNER.get(nbytes, 5)
    for _ in range(reps + 2):                  # alternated, so drift hits every peer alike
        for name, fn in runs.items():
            with comm.configure(transport="shm" if name.startswith("shm") else "gloo", checks=False):
                fn()
                dist.barrier()
                out[name].append(_slowest(_timed(lambda: [fn() for _ in range(inner)])) / inner)
    return {name: statistics.median(ts[2:]) for name, ts in out.items()}


def rank_main(reps: int) -> dict:
    per = {t: _pingpong(t) for t in ("gloo", "shm")}
    rows = [{"bytes": n, **_allreduce(n, reps)} for n in SIZES]
    return {"pingpong_s": per, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--json")
    args = p.parse_args()
    copy = memcpy_gbps()
    print(f"single-thread memcpy: {copy:.2f} GB/s (half: {copy / 2:.2f})")
    report = {"memcpy_gbps": copy, "runs": {}}
    for n in (int(x) for x in args.ranks.split(",")):
        got = launch.spawn(rank_main, n, (args.reps,), timeout=1200)[0]
        report["runs"][n] = got
        ping = got["pingpong_s"]
        print(f"\n{n} ranks: one 4-byte message: gloo {ping['gloo'] * 1e6:.1f} us, shm {ping['shm'] * 1e6:.1f} us "
              f"({ping['gloo'] / ping['shm']:.0f}x)")
        print(f"{'size':>8} {'shm ring':>10} {'shared':>10} {'gloo ring':>10} {'gloo all_reduce':>16} "
              f"{'busbw shm':>10} {'x gloo all_reduce':>18} {'x memcpy':>9} {'shared x memcpy':>16}")
        for row in got["rows"]:
            bus = {k: row["bytes"] / row[k] / 1e9 * 2 * (n - 1) / n
                   for k in ("shm ring", "shm ring, shared", "gloo ring", "gloo all_reduce")}
            row["busbw_gbps"] = bus
            print(f"{row['bytes'] >> 20:>6}Mi {row['shm ring'] * 1e3:>8.2f}ms {row['shm ring, shared'] * 1e3:>8.2f}ms "
                  f"{row['gloo ring'] * 1e3:>8.2f}ms {row['gloo all_reduce'] * 1e3:>14.2f}ms {bus['shm ring']:>8.2f}GB/s "
                  f"{bus['shm ring'] / bus['gloo all_reduce']:>17.2f}x {bus['shm ring'] / copy:>8.2f}x "
                  f"{bus['shm ring, shared'] / copy:>15.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
