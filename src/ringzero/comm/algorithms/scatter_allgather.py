"""Van de Geijn broadcast: binomial scatter, then ring all-gather (for large messages).

Barnett, Gupta, Payne, Shuler, van de Geijn & Watts 1994, "Interprocessor collective communication
library (InterCom)"; Thakur, Rabenseifner & Gropp 2005 §3.3 (MPICH's long-message broadcast).
A binomial-tree broadcast sends the whole S on each of ⌈log2 n⌉ rounds; cutting S into n chunks,
scattering them (rank v gets chunk v) and then all-gathering them moves only about 2·(n-1)/n·S
per rank, the same bandwidth term as ring all-reduce, at the price of ⌈log2 n⌉ + n - 1 rounds.

Ranks are relabelled relative to the root, v = (r - root) mod n, and relative rank v ends the
scatter holding buffer chunk v (not chunk r): then every binomial subtree — relative ranks
[v, v + m) — owns the contiguous buffer range of chunks [v, v + m) and each tree edge is one
message. The ring all-gather then runs on the absolute ring r -> r+1 with `shift = -root`, i.e.
starting from chunk (r - root) mod n, which is exactly what the scatter left there.

Binomial scatter (MPICH's MPIR_Scatter): relative rank v > 0 receives its subtree's chunks from
v - lowbit(v); then, for mask = lowbit(v)/2, …, 1 (the root: from the largest power of two below n),
it sends chunks [v + mask, v + 2·mask) to v + mask when that rank exists. This works unchanged for
any n: a subtree that would reach past n - 1 is simply cut at n (no folding needed). Each send is
its own step (round), posted without waiting for the previous one since they are independent.
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm
from ringzero.plan.comm.schedules import scatter_schedule
from ringzero.comm.algorithms.ring import all_gather as ring_all_gather


def _binomial_scatter(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Leave buffer chunk (rank - root) mod n on every rank, along a binomial tree rooted at `root`."""
    n = c.size
    recv, sends = scatter_schedule(n, (c.rank - root) % n)
    if recv is not None:
        peer, lo, hi = recv
        c.sendrecv([], [((peer + root) % n, buf[bounds[lo]:bounds[hi]])])
    pending = [c.exchange([((peer + root) % n, buf[bounds[lo]:bounds[hi]])], [])
               for peer, lo, hi in sends]
    # The all-gather writes other chunks of `buf`, some of which are still being sent from here.
    for h in pending:
        h.wait()


def broadcast(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Scatter the n chunks along a binomial tree, then ring all-gather them (relative chunks)."""
    if c.size == 1:
        return
    _binomial_scatter(c, buf, bounds, root)
    ring_all_gather(c, buf, bounds, shift=-root)
