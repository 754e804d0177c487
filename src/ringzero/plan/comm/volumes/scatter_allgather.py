"""Van de Geijn broadcast traffic: binomial scatter + ring all-gather (Thakur et al. 2005 §3.3).

Relative rank v = (r - root) mod n ends the scatter with chunk v (sizes `call.sizes`, near-equal).
Scatter: v > 0 receives chunks [v, v + lowbit(v)) ∩ [0, n) from its parent in one message, then
sends chunks [v + m, v + 2m) ∩ [0, n) to v + m for m = lowbit(v)/2, …, 1 (the root: m from the
largest power of two below n), one round each. All-gather: the ring of
`ringzero.plan.comm.volumes.ring` started from chunk v (shift = -root): n-1 rounds, rank r sends every
chunk but v+1 and receives every chunk but v (mod n), cut in pipelining segments.

Closed form with equal chunks s = S/n and n a power of two: the root sends (n-1)·s in the scatter
in log2 n messages; a rank with subtree size m receives m·s. Every rank then moves (n-1)·s each
way in the all-gather: about 2·(n-1)/n·S in total per rank instead of the tree's log2 n · S.
"""

from __future__ import annotations

from ringzero.plan.comm.volume import Call, Tally, Volume
from ringzero.plan.comm.schedules import scatter_schedule
from ringzero.plan.comm.volumes.ring import _phase as ring_phase


def broadcast(call: Call, rank: int) -> Volume:
    n, sizes = call.n, call.chunks
    t = Tally(call.itemsize)
    recv, sends = scatter_schedule(n, (rank - call.root) % n)
    if recv is not None:
        t.step([], [sizes.span(recv[1], recv[2])])
    for _, lo, hi in sends:
        t.step([sizes.span(lo, hi)], [])
    ring_phase(call, rank, -call.root, False, t)
    return t.volume()
