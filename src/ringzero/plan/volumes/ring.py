"""Ring traffic (Patarasuk & Yuan 2009; seed 000 §9.3.6, seed 004 §2.4).

Per rank r, reduce-scatter and all-gather each take n-1 steps; at step s rank r sends chunk
(r + shift - s) and receives chunk (r + shift - s - 1) (mod n). So over a phase r sends every
chunk but (r + shift + 1) and receives every chunk but (r + shift): with equal chunks that is
(n-1)/n·S each way, and all-reduce sends 2(n-1)/n·S — seed 004's 2(N-1)Φ/N — exactly
`count - sizes[...]` bytes when S is not divisible by n. Each message is cut in segments of
`call.segment_bytes`, so messages = Σ ceil(chunk/segment) while rounds stay n-1 per phase.
"""

from __future__ import annotations

from ..comm_volume import Call, Tally, Volume


def _phase(call: Call, rank: int, shift: int, reduce: bool, t: Tally) -> None:
    n, sizes = call.n, call.sizes
    for s in range(n - 1):
        out, inc = sizes[(rank + shift - s) % n], sizes[(rank + shift - s - 1) % n]
        t.step([out], [inc], reduce=inc if reduce else 0, segment=call.segment_elems)


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
