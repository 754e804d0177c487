"""The rank side of `ringzero bench comm`: data check and timing of every cell, as nccl-tests does.

For one (collective, size) all algorithms share one set of buffers. Each algorithm first runs once
on fresh inputs of small integers (x_r[i] = (i + 3r + j) mod 5, exact in every dtype) and its output
is compared element by element with the known result: the count of wrong elements, summed over
ranks, is the #wrong column. Then one untimed call, `warmup` timed calls that set how many calls
(`inner`) make one repetition last about `target_s`, and `iters` repetitions, each started after a
barrier: time = wall time of the repetition / inner on each rank, then the max over ranks (the
slowest rank finishes the collective; nccl-tests does the same). Repetitions of the algorithms are
interleaved (rep 1 of every algorithm, then rep 2, ...) so that drift in the machine's load hits
all of them alike. A row reports the median repetition.

Worlds smaller than the launch are prefix sub-groups {0..w-1}; the other ranks wait at a barrier.

Under the link emulator (`Job.inter_node_gbps`) the untimed call of each algorithm runs under a
traffic meter, and the row's cross_node_bytes is the most bytes any rank sent to other nodes in it.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.bench import comm_memory
from ringzero.comm import p2p, transport
from ringzero.plan.comm.algorithms import spans_nodes_ok
from ringzero.plan.comm.chunks import chunk_sizes

TARGET_S = 0.01
"""Aim for repetitions of about this long: one barrier's skew is then small against the time."""
MAX_INNER = 200
SENTINEL = 127
"""Fills outputs before the checked call: no input (0..4) nor sum of < 32 ranks' inputs equals it,
so an element an algorithm forgot to write is counted wrong. Exact in every supported dtype."""
CHECK_ELEMENTS = 1 << 20
"""`Cell.wrong` compares this many elements at a time: its temporaries stay a few MiB."""


@dataclass(frozen=True)
class Job:
    """What every rank measures (built and validated by `bench.comm` before any rank starts)."""

    worlds: tuple[int, ...]
    cases: tuple[tuple[str, tuple[str, ...]], ...]
    """(collective, algorithms) in measuring order."""
    sizes: tuple[int, ...]
    """Bytes of the whole buffer (`plan.comm.volume.call_for` convention)."""
    dtype: str
    iters: int
    warmup: int
    ranks_per_node: int | None = None
    every_algorithm: bool = True
    """The algorithm list is the default (all): skip the node-aware algorithms where they would span
    one node (or, for hierarchical_2d, part of one)."""
    target_s: float = TARGET_S
    """Aim for repetitions of about this many seconds (more calls per repetition when short)."""
    inter_node_gbps: float | None = None
    """Emulated inter-node link between nodes of `ranks_per_node` ranks, GB/s (None: none)."""
    inter_node_latency_us: float = 0.0
    """Its latency per message, µs."""
    transport: str = "auto"
    """How ringzero's messages travel (`comm.transport`)."""


def element_count(collective: str, nbytes: int, itemsize: int, n: int) -> int:
    """Elements for `nbytes`: whole elements, and a multiple of n where the chunks must be equal."""
    count = nbytes // itemsize
    if collective not in ("all_reduce", "reduce", "broadcast"):
        count -= count % n
    return count


def _pat(m: int, key: int, dtype, ranks: int = 1) -> torch.Tensor:
    """m elements, element i = sum over q < `ranks` of (i + key + 3q) mod 5: rank r's input is
    (m, 3r), the sum of n ranks' inputs (m, 0, ranks=n). The pattern repeats every 5 elements, so it
    is made from its period in `dtype`, exactly as an int64 sum cast to `dtype` would be, without
    int64 temporaries as long as the buffer (8 bytes an element: 6x a float32 buffer at the peak)."""
    five = sum((torch.arange(5) + key + 3 * q) % 5 for q in range(ranks))
    return five.to(dtype).repeat(-(-m // 5))[:m]


def _stacked(parts: list[tuple[int, int]], dtype) -> torch.Tensor:
    """The patterns (m, key) one after another, written piece by piece into one buffer (no copy of
    the whole as `torch.cat` would make)."""
    out = torch.empty(sum(m for m, _ in parts), dtype=dtype)
    at = 0
    for m, key in parts:
        out[at:at + m].copy_(_pat(m, key, dtype))
        at += m
    return out


class Cell:
    """Buffers, the expected result and the call of one collective of `count` elements.

    As nccl-tests does, a rank holds one send buffer, one receive buffer and one expected result at
    most (`bench.comm_memory.BUFFERS` counts them per collective): the in-place collectives keep
    their fresh input beside the buffer they reduce into, a broadcast's root compares with its own
    input, and `wrong` compares in pieces of `CHECK_ELEMENTS`."""

    def __init__(self, collective, group, count, dtype):
        self.collective, self.group, self.dtype = collective, group, dtype
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        n, r, m = self.n, self.rank, count // self.n
        pat = lambda size, key: _pat(size, key, dtype)  # noqa: E731
        self.fresh = None
        """The in-place collectives' input, copied into `buf` before the checked call (None: the
        sentinel, for a broadcast's receivers)."""
        if collective in ("all_reduce", "reduce", "broadcast"):
            self.buf = torch.empty(count, dtype=dtype)
            if collective != "broadcast" or r == 0:
                self.fresh = pat(count, 3 * r)
            if collective == "broadcast":
                self.expect = self.fresh if r == 0 else pat(count, 0)
            else:                        # the sum of every rank's input, where this rank receives it
                self.expect = _pat(count, 0, dtype, ranks=n) if collective == "all_reduce" or r == 0 else None
        elif collective == "all_gather":
            self.inp, self.out = pat(m, 3 * r), torch.empty(count, dtype=dtype)
            self.expect = _stacked([(m, 3 * q) for q in range(n)], dtype)
        elif collective == "reduce_scatter":
            self.inp, self.out = pat(count, 3 * r), torch.empty(m, dtype=dtype)
            self.expect = _pat(m, r * m, dtype, ranks=n)
        elif collective == "gather":
            self.inp = pat(m, 3 * r)
            self.outs = [torch.empty(m, dtype=dtype) for _ in range(n)] if r == 0 else None
            self.expect = _stacked([(m, 3 * q) for q in range(n)], dtype) if r == 0 else None
        elif collective == "scatter":
            self.ins = [pat(m, 3 * q) for q in range(n)] if r == 0 else None
            self.out, self.expect = torch.empty(m, dtype=dtype), pat(m, 3 * r)
        elif collective == "all_to_all":
            sizes = chunk_sizes(count, n)  # rank r sends chunk j of its buffer to rank j
            self.ins = [pat(sizes[j], 3 * r + j) for j in range(n)]
            self.outs = [torch.empty(sizes[r], dtype=dtype) for _ in range(n)]
            self.expect = _stacked([(sizes[r], 3 * q + r) for q in range(n)], dtype)
        else:
            raise ValueError(f"unknown collective {collective!r}")

    def reset(self) -> None:
        """Fresh inputs before the checked call (in-place collectives consumed the last ones)."""
        if hasattr(self, "buf"):
            if self.fresh is not None:
                self.buf.copy_(self.fresh)
            else:
                self.buf.fill_(SENTINEL)
        for name in ("out", "outs"):
            for t in _as_list(getattr(self, name, None)):
                t.fill_(SENTINEL)

    def quiesce(self) -> None:
        """Zeros in the in-place buffer, so repeated sums stay finite while timing."""
        if self.collective in ("all_reduce", "reduce"):
            self.buf.zero_()

    def call(self, algorithm: str) -> None:
        c, g, a = self.collective, self.group, algorithm
        if c == "all_reduce":
            comm.all_reduce(self.buf, group=g, algorithm=a)
        elif c == "reduce":
            comm.reduce(self.buf, 0, group=g, algorithm=a)
        elif c == "broadcast":
            comm.broadcast(self.buf, 0, group=g, algorithm=a)
        elif c == "all_gather":
            comm.all_gather_into_tensor(self.out, self.inp, group=g, algorithm=a)
        elif c == "reduce_scatter":
            comm.reduce_scatter_tensor(self.out, self.inp, group=g, algorithm=a)
        elif c == "gather":
            comm.gather(self.inp, self.outs, dst=0, group=g, algorithm=a)
        elif c == "scatter":
            comm.scatter(self.out, self.ins, src=0, group=g, algorithm=a)
        else:
            comm.all_to_all(self.outs, self.ins, group=g, algorithm=a)

    def wrong(self) -> int:
        """Elements of this rank's output that differ from the exact result, compared piece by piece
        into one mask: a comparison of the whole would hold a bool per element more, and a fresh
        mask per piece is a fresh allocation each time, which the tuned allocator may not reuse."""
        if self.expect is None:
            return 0
        got = {"all_reduce": "buf", "reduce": "buf", "broadcast": "buf", "all_gather": "out",
               "reduce_scatter": "out", "scatter": "out", "gather": "outs", "all_to_all": "outs"}
        mask = torch.empty(min(CHECK_ELEMENTS, self.expect.numel()), dtype=torch.bool)
        wrong, at = 0, 0
        for piece in _as_list(getattr(self, got[self.collective])):
            for lo in range(0, piece.numel(), CHECK_ELEMENTS):
                hi = min(lo + CHECK_ELEMENTS, piece.numel())
                torch.ne(piece[lo:hi], self.expect[at + lo:at + hi], out=mask[:hi - lo])
                wrong += int(torch.count_nonzero(mask[:hi - lo]))   # a bool sum would copy it to int64
            at += piece.numel()
        return wrong


def _as_list(x):
    return [] if x is None else (x if isinstance(x, list) else [x])


def _max_over(group, values: list[float], op=dist.ReduceOp.MAX) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def _timed(cell: Cell, algorithm: str, inner: int) -> float:
    dist.barrier(group=cell.group)
    t0 = time.perf_counter()
    for _ in range(inner):
        cell.call(algorithm)
    return (time.perf_counter() - t0) / inner


def check(cell: Cell, algorithms) -> list[int]:
    """Run each algorithm once on fresh inputs; this rank's wrong elements per algorithm."""
    wrong = []
    for a in algorithms:
        cell.reset()
        cell.call(a)
        wrong.append(cell.wrong())
    cell.quiesce()
    return wrong


def measure_cell(group, collective: str, algorithms, count: int, job: Job) -> list[dict]:
    """Check and time every algorithm on one (collective, count); rows are valid on every rank."""
    dtype = getattr(torch, job.dtype)
    cell = Cell(collective, group, count, dtype)
    p2p.reserve(dtype, "cpu", math.ceil(comm_memory.scratch(collective, algorithms, cell.n) * count))
    wrong, inner, cross = check(cell, algorithms), [], []
    for a in algorithms:
        meter = comm.TrafficMeter() if job.inter_node_gbps is not None else None
        with meter or contextlib.nullcontext():
            cell.call(a)  # the first timed call would also pay for lazily built state (groups, buffers)
        if meter is not None:
            cross.append(float(meter.total().cross_node_bytes_sent))
        inner.append(_timed(cell, a, max(1, job.warmup)))
    wrong = _max_over(group, [float(w) for w in wrong], dist.ReduceOp.SUM)
    cross = _max_over(group, cross) if cross else None
    inner = [max(1, min(MAX_INNER, int(job.target_s / max(t, 1e-9)))) for t in _max_over(group, inner)]
    reps = [[] for _ in algorithms]
    for _ in range(job.iters):
        for i, a in enumerate(algorithms):
            reps[i].append(_timed(cell, a, inner[i]))
    flat = _max_over(group, [t for r in reps for t in r])
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = []
    for i, a in enumerate(algorithms):
        times = flat[i * job.iters:(i + 1) * job.iters]
        rows.append({"collective": collective, "algorithm": a, "world": cell.n, "count": count,
                     "itemsize": itemsize, "dtype": job.dtype, "size": count * itemsize,
                     "ranks_per_node": job.ranks_per_node, "time_us": statistics.median(times) * 1e6,
                     "reps_us": [t * 1e6 for t in times], "inner": inner[i], "wrong": int(wrong[i]),
                     "transport": str(dist.get_backend(group)) if a == "torch" else transport.in_use(group)})
        if cross is not None:
            rows[-1]["cross_node_bytes"] = int(cross[i])
    return rows


def rank_main(job: Job) -> list[dict] | None:
    """Entry point on every rank (`launch.spawn`); rank 0 returns all rows."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed *_tensor collectives
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = {w: dist.new_group(list(range(w))) if w < world else dist.group.WORLD for w in job.worlds}
    itemsize = torch.empty((), dtype=getattr(torch, job.dtype)).element_size()
    rows: list[dict] = []
    # Every scratch request from the arena: one cell runs at a time, its calls repeated hundreds of
    # times, so they reuse one set of pages instead of faulting fresh ones in (and fragmenting the heap).
    with comm.configure(checks=False, transport=job.transport, ranks_per_node=job.ranks_per_node, arena_max_bytes=None,
                        inter_node_gbps=job.inter_node_gbps,
                        inter_node_latency_us=job.inter_node_latency_us):
        for w in job.worlds:
            if rank < w:
                for collective, algorithms in job.cases:
                    algs = tuple(a for a in algorithms if not job.every_algorithm
                                 or spans_nodes_ok(a, w, job.ranks_per_node))
                    for nbytes in job.sizes:
                        count = element_count(collective, nbytes, itemsize, w)
                        rows += measure_cell(groups[w], collective, algs, count, job)
            dist.barrier()
    return rows if rank == 0 else None
