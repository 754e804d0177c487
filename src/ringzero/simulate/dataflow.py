"""A schedule played rank by rank and segment by segment, each message's host cost on its path.

`collective.play_schedule` plays a schedule's steps one after another, every flow of a step
sharing the links until the last is delivered (the synchronous model of the planner's
`emulated_seconds`). Real ranks do not wait for each other between steps, and the pipelined
algorithms do not wait for a whole step either: ringzero's ring cuts each chunk into segments
(a flow's `pieces`) and forwards a segment as soon as the same segment of the step before has come
in and been reduced (`comm.algorithms.ring`). Per rank r, step k and segment j, the max-plus
recurrence of a dataflow graph (Baccelli et al. 1992, "Synchronization and Linearity", §2):

    ready(r, k, j)  = done(r, k-1, j)                (the data it sends: the same segment a step
                                                      back; the whole step where the cut changes)
    arrive(m, j)    = start + bytes_j / B + α         (between nodes, one segment at a time on the
                      start = max(ready(src), NICs)   sender's NIC and the receiver's; inside a
                                                      node nothing is emulated: at ready)
    done(r, k, j)   = max(done(r, k, j-1), ready(r, k, j), arrivals into (r, k, j)) + host(r, k, j)

`host(r, k, j)` is a delay on the segment's path, not work that holds a core: on these CPU ranks a
call's host price is mostly per message (gloo's rendezvous, three socket writes and as many thread
wake-ups per message, and a receive posted only when it is awaited, so the bytes move after the
emulated transfer and not beside it; the calibration's per-message term is 0.2-0.5 ms, against
0.3 ms for a 1 MiB segment's bytes). So a link's transfer overlaps another segment's host delay,
never its own. The call's host price (the calibration's, with no link emulated) is spread over the
receiving rank-segments in proportion to their bytes and scaled so that the play with free links
takes exactly that price: the shape is the algorithm's, the total is measured.
"""

from __future__ import annotations

from collections import defaultdict

from ringzero.plan.comm.schedule.step import Schedule

Unit = tuple[int, int, int]
"""(step, rank, segment)."""


def _steps(sched: Schedule) -> list[list[tuple[int, int, int, int]]]:
    """Per step (from 0): its flows as (src, dst, bytes, pieces), zero-byte flows left out."""
    out = []
    for s in sched.steps:
        for i in range(s.repeat):
            sizes, pieces = s.sizes_at(i)
            out.append([(a, b, z, max(1, p)) for a, b, z, p in zip(s.src, s.dst, sizes, pieces) if z])
    return out


def _weights(steps) -> tuple[dict[Unit, float], list[dict[int, int]]]:
    """Bytes each rank receives per (step, rank, segment), and each step's segments per rank."""
    weight: dict[Unit, float] = defaultdict(float)
    units: list[dict[int, int]] = []
    for k, flows in enumerate(steps):
        cut: dict[int, int] = defaultdict(int)
        for src, dst, nbytes, p in flows:
            cut[src], cut[dst] = max(cut[src], p), max(cut[dst], p)
            for j in range(p):
                weight[(k, dst, j)] += nbytes / p
        units.append(dict(cut))
    return weight, units


def _play(steps, units, n: int, host: dict[Unit, float], node_of, bw: float, latency: float) -> float:
    """The recurrence of the module doc; returns when the last rank is done."""
    done: dict[int, list[float]] = {}          # rank -> done per segment of the last step it was in
    out_free, in_free = [0.0] * n, [0.0] * n

    def ready(r: int, j: int, p: int) -> float:
        prev = done.get(r)
        if prev is None:
            return 0.0
        return prev[j] if len(prev) == p else prev[-1]

    for k, flows in enumerate(steps):
        arrive: dict[tuple[int, int], float] = defaultdict(float)
        for src, dst, nbytes, p in flows:
            for j in range(p):
                t = ready(src, j, p)
                if node_of(src) != node_of(dst):
                    start = max(t, out_free[src], in_free[dst])
                    out_free[src] = in_free[dst] = start + nbytes / p / bw
                    t = out_free[src] + latency
                arrive[(dst, j)] = max(arrive[(dst, j)], t)
        now = {}
        for r, p in units[k].items():
            ends, t = [], 0.0
            for j in range(p):
                t = max(t, ready(r, j, p), arrive.get((r, j), 0.0)) + host.get((k, r, j), 0.0)
                ends.append(t)
            now[r] = ends
        done.update(now)
    return max((ends[-1] for ends in done.values()), default=0.0)


def dataflow_seconds(sched: Schedule, ranks_per_node: int, bw: float, latency: float, host_seconds: float) -> float:
    """Seconds of `sched` on ranks in nodes of `ranks_per_node` (group rank r on node r //
    ranks_per_node), every message between nodes at `bw` bytes/s and `latency` s, with
    `host_seconds` of host delay spread as the module doc says."""
    steps = _steps(sched)
    weight, units = _weights(steps)

    def node_of(r: int) -> int:
        return r // ranks_per_node

    free = _play(steps, units, sched.call.n, weight, node_of, float("inf"), 0.0)
    scale = host_seconds / free if free > 0 else 0.0
    return _play(steps, units, sched.call.n, {u: w * scale for u, w in weight.items()}, node_of, bw, latency)
