"""Ring traffic (Patarasuk & Yuan 2009).

Per rank r, reduce-scatter and all-gather each take n-1 steps; at step s rank r sends chunk
(r + shift - s) and receives chunk (r + shift - s - 1) (mod n). So over a phase r sends every
chunk but (r + shift + 1) and receives every chunk but (r + shift): with equal chunks that is
(n-1)/n·S each way, and all-reduce sends 2(n-1)/n·S — the bandwidth lower bound — exactly
`count - sizes[...]` bytes when S is not divisible by n. Each message is cut in segments of
`call.segment_bytes`, so messages = Σ ceil(chunk/segment) while rounds stay n-1 per phase.
"""

from __future__ import annotations

from ringzero.plan.comm.chunks import Chunks, n_segments
from ringzero.plan.comm.volume import Call, Tally, Volume


def _phase(call: Call, rank: int, shift: int, reduce: bool, t: Tally) -> None:
    """One phase in closed form (the planner prices rings of millions of ranks): rank r sends every
    chunk but e_out = r + shift + 1 and receives every chunk but e_in = r + shift (mod n); a step
    counts as a round when it moves a non-empty chunk either way."""
    n, sizes, seg = call.n, call.chunks, call.segment_elems
    e_out, e_in = sizes[(rank + shift + 1) % n], sizes[(rank + shift) % n]
    total = sizes.total
    pieces = sum(k * n_segments(size, seg) for size, k in sizes.histogram().items())
    t.rounds += _rounds(sizes, n, rank + shift)
    t.sent += total - e_out
    t.recv += total - e_in
    t.msgs_sent += pieces - n_segments(e_out, seg)
    t.msgs_recv += pieces - n_segments(e_in, seg)
    t.reduced += (total - e_in) if reduce else 0


def _rounds(sizes, n: int, first: int) -> int:
    """Steps s = 0..n-2 that move chunk j = first - s or j - 1 (mod n) with one of them non-empty.

    Every chunk non-empty: n - 1. Near-equal chunks of count < n elements (chunks 0..count-1 hold
    one each): step s is quiet iff j lies in count+1..n-1, and j takes every value but
    first + 1 (mod n), so the rounds are count + [first + 1 (mod n) >= count + 1]."""
    if sizes.nonempty() == n:
        return n - 1
    if isinstance(sizes, Chunks):
        count = sizes.total
        return count + ((first + 1) % n >= count + 1) if count else 0
    return sum(1 for s in range(n - 1) if sizes[(first - s) % n] or sizes[(first - s - 1) % n])


def reduce_scatter(call: Call, rank: int) -> Volume:
    t = Tally(call.itemsize)
    _phase(call, rank, -1, True, t)
    return t.volume()


def all_gather(call: Call, rank: int) -> Volume:
    t = Tally(call.itemsize)
    _phase(call, rank, 0, False, t)
    return t.volume()


def all_reduce(call: Call, rank: int) -> Volume:
    t = Tally(call.itemsize)
    _phase(call, rank, 0, True, t)   # reduce-scatter: rank r ends with chunk r+1
    _phase(call, rank, 1, False, t)  # all-gather starting from chunk r+1
    return t.volume()
