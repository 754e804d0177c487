"""Ring reduce-scatter, all-gather and all-reduce, pipelined in segments.

Seed 000 §9.3.6 and seed 004 §2.4; Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009. Ranks form the ring r -> r+1 (mod n). All-reduce is
reduce-scatter followed by all-gather: 2(n-1) steps, each moving one chunk of S/n bytes, so every rank
sends 2(n-1)/n·S — bandwidth-optimal and independent of n. Works for any n (no power-of-two
requirement) and any count: chunks follow `plan.chunks.chunk_bounds`, so they differ by at most one
element and may be empty.

Pipelining: each step's chunk is cut into segments of `SEGMENT_BYTES`, and a *unit* is one segment
of one step. A unit's send only waits for the unit that produced its data (the same segment of the
previous step), never for the whole step. Receives are posted ahead of need — every all-gather
receive at once, straight into place; reduce-scatter receives `DEPTH` units ahead into rotating
scratch slots — so the wire (gloo's I/O thread) always has work queued while this thread reduces.
Measured on 4 gloo ranks, one segment of lookahead left the reduce-scatter latency-bound; queued
receives are what close the gap to gloo's own C++ all-reduce (README, `make bench`).

NCCL serialises separately issued point-to-point calls on one stream, so a receive posted ahead of
a send would block the ring there; on such backends (`c.async_p2p` false) each unit's send and
receive go together in one batch, in lockstep.
"""

from __future__ import annotations

from ...plan.chunks import SEGMENT_BYTES, segments

DEPTH = 8
"""Reduce-scatter receives in flight (scratch: DEPTH segments)."""


def _schedule(n, r, bounds, shift, seg):
    """Units in posting order: (step, (send_lo, send_hi), (recv_lo, recv_hi), dep).

    At step s rank r sends chunk (r + shift - s) and receives chunk (r + shift - s - 1); `dep` is
    the unit whose received segment this unit forwards (-1: the rank's own data, step 0).
    """
    units, prev = [], {}
    for s in range(n - 1):
        si, ri = (r + shift - s) % n, (r + shift - s - 1) % n
        out, inc = segments(bounds[si + 1] - bounds[si], seg), segments(bounds[ri + 1] - bounds[ri], seg)
        cur = {}
        for k in range(max(len(out), len(inc))):
            a = out[k] if k < len(out) else (0, 0)
            b = inc[k] if k < len(inc) else (0, 0)
            cur[k] = len(units)
            units.append((s, (bounds[si] + a[0], bounds[si] + a[1]), (bounds[ri] + b[0], bounds[ri] + b[1]),
                          prev.get(k, -1)))
        prev = cur
    return units


class _Rounds:
    """Counts one round per step: the first non-empty message of a step opens it."""

    def __init__(self) -> None:
        self.open = set()

    def first(self, step: int, nonempty: bool) -> bool:
        if not nonempty or step in self.open:
            return False
        self.open.add(step)
        return True


def _drive(c, buf, units, reduce: bool) -> None:
    """Run the units: receive (into scratch and reduce, or into place), forward when ready."""
    right, left = (c.rank + 1) % c.size, (c.rank - 1) % c.size
    seg = max((hi - lo for _, _, (lo, hi), _ in units), default=0)
    rounds = _Rounds()
    if not c.async_p2p:
        return _lockstep(c, buf, units, reduce, right, left, seg, rounds)
    slots = [c.empty(seg) for _ in range(DEPTH)] if reduce else []
    recvs, sends = [], []
    posted_send, done = 0, -1
    for i, (_, _, (rlo, rhi), _) in enumerate(units):
        while len(recvs) < len(units) and (not reduce or len(recvs) < i + DEPTH):
            j = len(recvs)
            step, _, (lo, hi), _ = units[j]
            dst = slots[j % DEPTH][: hi - lo] if reduce else buf[lo:hi]
            recvs.append(c.exchange((), [(left, dst)], new_round=rounds.first(step, hi > lo)))
        while posted_send < len(units) and units[posted_send][3] <= done:
            step, (lo, hi), _, _ = units[posted_send]
            sends.append(c.exchange([(right, buf[lo:hi])], (), new_round=rounds.first(step, hi > lo)))
            posted_send += 1
        recvs[i].wait()
        if reduce:
            c.reduce(buf[rlo:rhi], slots[i % DEPTH][: rhi - rlo])
        done = i
    for j in range(posted_send, len(units)):
        step, (lo, hi), _, _ = units[j]
        sends.append(c.exchange([(right, buf[lo:hi])], (), new_round=rounds.first(step, hi > lo)))
    for h in sends:
        h.wait()


def _lockstep(c, buf, units, reduce, right, left, seg, rounds) -> None:
    scratch = c.empty(seg) if reduce else None
    for step, (slo, shi), (rlo, rhi), _ in units:
        dst = scratch[: rhi - rlo] if reduce else buf[rlo:rhi]
        c.sendrecv([(right, buf[slo:shi])], [(left, dst)], new_round=rounds.first(step, shi > slo or rhi > rlo))
        if reduce:
            c.reduce(buf[rlo:rhi], dst)


def _segment_elems(c) -> int:
    return max(1, SEGMENT_BYTES // c.itemsize)


def reduce_scatter(c, buf, bounds, shift: int = -1) -> None:
    """After n-1 steps rank r holds chunk (r + shift + 1) mod n fully reduced in `buf`.

    At step s rank r sends chunk (r + shift - s) to its right neighbour and reduces chunk
    (r + shift - s - 1), received from its left neighbour, into its own copy. `shift=-1` leaves
    chunk r on rank r (reduce_scatter's contract); all-reduce uses `shift=0`, the seed's walk-through
    (step 1: a0 -> B, b1 -> C, c2 -> D, d3 -> A).
    """
    if c.size > 1:
        _drive(c, buf, _schedule(c.size, c.rank, bounds, shift, _segment_elems(c)), reduce=True)


def all_gather(c, buf, bounds, shift: int = 0) -> None:
    """Rank r starts with chunk (r + shift) mod n; after n-1 steps every rank holds every chunk.

    At step s rank r forwards chunk (r + shift - s) to its right neighbour and receives chunk
    (r + shift - s - 1) from its left one, straight into place.
    """
    if c.size > 1:
        _drive(c, buf, _schedule(c.size, c.rank, bounds, shift, _segment_elems(c)), reduce=False)


def all_reduce(c, buf, bounds) -> None:
    """Reduce-scatter then all-gather on the ring (seed 000 §9.3.6): 2(n-1) steps."""
    reduce_scatter(c, buf, bounds, shift=0)
    all_gather(c, buf, bounds, shift=1)
