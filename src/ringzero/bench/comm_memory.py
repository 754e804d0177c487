"""Host memory `ringzero bench comm` needs, checked before its ranks start (as `twin.footprint`
checks a training run, against the same `available_bytes`), and the scratch its ranks set aside.

A rank measures one cell (collective, size, world) at a time and holds, as nccl-tests does, the
cell's buffers (`comm_ranks.Cell`): one send buffer, one receive buffer and one expected result at
most, `BUFFERS` of them per byte of the buffer on the busiest rank (an all-reduce 3: the buffer it
reduces into, its fresh input, the exact sum). Each call of a ringzero algorithm adds its scratch:
its receive buffers and the work copies the call makes of the caller's tensors (`comm.api.work`),
`SCRATCH` per byte on the busiest rank (`plan.comm.scratch`), from the code of each algorithm (a naive all-reduce's root
receives every other rank's buffer in one step: n - 1; a ring's receives one chunk: 1/n);
`tests/test_bench_memory.py` runs every algorithm and checks that no rank asks for more. The
bench's ranks take all of it from the scratch arena (`comm.p2p`), sized once per cell to the most
the cell's algorithms take, so every call reuses the same pages. The backend's own collectives
(algorithm "torch") allocate inside gloo: their `SCRATCH` is measured (the growth of the busiest
rank's VmHWM over the cell's buffers, 64 MiB of float32 on 2 ranks, rounded up).

A rank then peaks at `PROCESS_BYTES + (BUFFERS + the largest SCRATCH of its algorithms) x the
largest buffer`, the most over the job's collectives and worlds; the job, the ranks times that.
"""

from __future__ import annotations

import math

from ringzero.plan.comm.scratch import SCRATCH, Rule, scratch  # noqa: F401  (SCRATCH: the rule, read here)
from ringzero.twin.footprint import PROCESS_BYTES, available_bytes

BUFFERS: dict[str, Rule] = {
    "all_reduce": lambda n: 3,                 # buffer, fresh input, exact sum
    "reduce": lambda n: 3,                     # the same on the root
    "broadcast": lambda n: 2,                  # buffer, the root's input (its own expected result)
    "all_gather": lambda n: 2 + 1 / n,         # output, expected output, this rank's chunk
    "reduce_scatter": lambda n: 1 + 2 / n,     # input, this rank's chunk and its expected sum
    "gather": lambda n: 2 + 1 / n,             # the root's outputs and expected outputs, its chunk
    "scatter": lambda n: 1 + 2 / n,            # the root's inputs, its chunk and its expected chunk
    "all_to_all": lambda n: 3,                 # inputs, outputs, expected outputs
}
"""`comm_ranks.Cell`'s buffers on the busiest rank, per byte of the whole buffer."""


def factor(cases, worlds) -> float:
    """Bytes a rank holds per byte of the largest buffer, the most over `cases` ((collective,
    algorithms)) on every world of `worlds`."""
    return max((BUFFERS[c](n) + scratch(c, algs, n) for c, algs in cases for n in worlds), default=0.0)


def rank_bytes(largest: int, per_byte: float) -> int:
    """Bytes one rank holds at its peak when its largest buffer is `largest` bytes."""
    return PROCESS_BYTES + math.ceil(per_byte * largest)


def check(sizes: tuple[int, ...], ranks: int, cases, worlds, force: bool = False) -> int:
    """The job's bytes; ValueError (one line, with the numbers) when they exceed what the machine
    has available and `force` is not set."""
    per_byte = factor(cases, worlds)
    each = rank_bytes(max(sizes), per_byte)
    need, room = ranks * each, available_bytes()
    if room is not None and need > room and not force:
        gib = 2**30
        raise ValueError(
            f"{ranks} ranks need about {need / gib:.1f} GiB for --sizes up to {max(sizes) / gib:.3g} GiB "
            f"({each / gib:.2f} GiB each: {PROCESS_BYTES / gib:.2f} process, {per_byte:.3g} x the largest "
            f"buffer: its send, receive and expected buffers and the algorithms' scratch) but {room / gib:.1f} "
            f"GiB is available; use smaller --sizes, fewer ranks or algorithms, or --force")
    return need
