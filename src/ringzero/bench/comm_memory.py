"""Host memory `ringzero bench comm` needs, checked before its ranks start (as `twin.footprint`
checks a training run, against the same `available_bytes`).

Each rank measures one cell (collective, size) at a time, and the buffers of a cell are freed before
the next; but every rank runs with the tuned allocator (`ringzero.allocator`), which keeps freed
memory in the process, so a rank holds about the peak of its largest cell until it exits. That
peak is far above the buffer: the cell's input, output and expected result (`comm_ranks.Cell`), the
int64 reference sums the expected result is computed in, the work copies and receive buffers of
every algorithm run in turn, and the allocator's fragmentation between them. `CELL_FACTOR` is the
most any rank's peak resident memory grew per byte of the cell's buffer, measured on the
development machine over every collective with all its algorithms (64 MiB of float32 on 2 ranks:
up to 25x, for all_reduce and broadcast: `ringzero bench comm --nproc 2 --collective all_reduce
--sizes 64MiB`, and each other collective, with each rank's VmHWM in /proc/PID/status against its
VmRSS before the cell), rounded up; a wider dtype needs fewer int64 bytes per buffer byte, so
the factor overestimates float64 and int64 a little. The whole job: `ranks x (PROCESS_BYTES +
CELL_FACTOR x largest size)`.
"""

from __future__ import annotations

from ringzero.twin.footprint import PROCESS_BYTES, available_bytes

CELL_FACTOR = 32
"""Peak bytes a rank holds per byte of its largest cell's buffer (see the module doc)."""


def rank_bytes(largest: int) -> int:
    """Bytes one rank holds at its peak when its largest buffer is `largest` bytes."""
    return PROCESS_BYTES + CELL_FACTOR * largest


def check(sizes: tuple[int, ...], ranks: int, force: bool = False) -> int:
    """The job's bytes; ValueError (one line, with the numbers) when they exceed what the machine
    has available and `force` is not set."""
    need = ranks * rank_bytes(max(sizes))
    room = available_bytes()
    if room is not None and need > room and not force:
        gib = 2**30
        raise ValueError(
            f"{ranks} ranks need about {need / gib:.1f} GiB for --sizes up to {max(sizes) / gib:.3g} GiB "
            f"({rank_bytes(max(sizes)) / gib:.2f} GiB each: {PROCESS_BYTES / gib:.2f} process, {CELL_FACTOR} x "
            f"the largest buffer) but {room / gib:.1f} GiB is available; use smaller --sizes, fewer ranks, or --force")
    return need
