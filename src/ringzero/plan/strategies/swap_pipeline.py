"""The NVMe swap loop's time: read i+1 ∥ update i ∥ write i-1 on one I/O queue and one host,
with the slowdown each suffers while the other runs (ZeRO-Infinity, Rajbhandari et al. 2021 §5).

One I/O thread runs a FIFO queue: the reads of chunks 0..B-1 first, then, once chunk i's update
has ended, the write of chunk i and the read of chunk i+B into the buffer just written. Chunk i's
update starts when update i-1 has ended and read i has. The step ends with the last write.

Shared cores. On a GPU machine the update runs on host cores the I/O does not need, and the two
overlap freely. On a small host (here: 2 cores, the fused AdamW on both) they slow each other
down: the I/O thread's system calls wait for a core and the update loses one. `io_slowdown` and
`compute_slowdown` are how many times longer each takes while the other is running (1: no
interference), measured by a probe that runs both at once (`parallel.offload.nvme_swap`; both are
printed by `python benchmarks/bench_offload.py`). The loop is
simulated event by event: between two events each active task progresses at 1 or 1/slowdown of
its own speed, depending on whether the other resource is busy at that moment.

With both slowdowns 1 this is the plain recurrence: in steady state a chunk costs
max(compute_i, read_i + write_i), plus the fill (the first read) and the drain (the last write).
"""

from __future__ import annotations

from typing import Sequence


def io_queue(n: int, buffer_count: int) -> list[tuple[str, int]]:
    """The I/O thread's operations in queue order: ("read" | "write", chunk)."""
    ops = [("read", j) for j in range(min(buffer_count, n))]
    for i in range(n):
        ops.append(("write", i))
        if i + buffer_count < n:
            ops.append(("read", i + buffer_count))
    return ops


def swap_seconds(read_s: Sequence[float], compute_s: Sequence[float], write_s: Sequence[float],
                 buffer_count: int, io_slowdown: float = 1.0, compute_slowdown: float = 1.0) -> float:
    """Seconds of the swap loop: chunk i reads for `read_s[i]`, updates for `compute_s[i]` and
    writes for `write_s[i]` when running alone; one FIFO I/O queue, `buffer_count` buffers."""
    if buffer_count < 1 or io_slowdown <= 0 or compute_slowdown <= 0:
        raise ValueError(f"swap_seconds needs buffer_count >= 1 and slowdowns > 0, got {buffer_count}, "
                         f"{io_slowdown}, {compute_slowdown}")
    n = len(compute_s)
    ops = io_queue(n, buffer_count)
    work = {"read": read_s, "write": write_s}
    read_done, computed = [False] * n, 0           # chunks whose update has ended: 0..computed-1
    t, op, host = 0.0, 0, 0                        # now, next I/O operation, next chunk to update
    io_left = work[ops[0][0]][ops[0][1]] if ops else 0.0
    host_left = compute_s[0] if n else 0.0
    while op < len(ops) or host < n:
        kind, chunk = ops[op] if op < len(ops) else ("", -1)
        io_on = op < len(ops) and (kind == "read" or chunk < computed)
        host_on = host < n and read_done[host]
        if not (io_on or host_on):
            raise AssertionError("swap loop stalled")  # unreachable: some read or update can go
        io_rate = 1 / io_slowdown if host_on else 1.0
        host_rate = 1 / compute_slowdown if io_on else 1.0
        dt = min(io_left / io_rate if io_on else float("inf"), host_left / host_rate if host_on else float("inf"))
        t += dt
        if io_on:
            io_left -= dt * io_rate
            if io_left <= 1e-15:
                if kind == "read":
                    read_done[chunk] = True
                op += 1
                io_left = work[ops[op][0]][ops[op][1]] if op < len(ops) else 0.0
        if host_on:
            host_left -= dt * host_rate
            if host_left <= 1e-15:
                host += 1
                computed = host
                host_left = compute_s[host] if host < n else 0.0
    return t
