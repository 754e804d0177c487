"""Pairwise-exchange all-to-all (Thakur, Rabenseifner & Gropp 2005 §3.6).

All-to-all is a distributed matrix transpose: rank i's chunk j goes to rank j (the token shuffle
of a mixture-of-experts layer, Lepikhin et al. 2021). The pairwise exchange does it in n-1 steps,
each rank talking to exactly one destination and one source per step, so no rank is flooded by
n-1 simultaneous messages (the weakness of the naive all-post version):

- n a power of two: at step s = 1..n-1 rank r swaps chunks with partner r XOR s. XOR is an
  involution, so the pairs are perfect matchings and each step is a clean bidirectional exchange.
- any other n (MPICH's fold for non-powers of two): at step s rank r sends to (r+s) mod n and
  receives from (r-s) mod n. Every ordered pair (i, j), i != j, meets at exactly one step s = j-i.

Each step is ONE `exchange` (its send and its receive posted together), so it cannot deadlock; its
own chunk is copied locally. Cost: (n-1) rounds, each rank sending and receiving (n-1)/n·S with
equal chunks: T ≈ (n-1)α + (n-1)/n·S·β. Empty chunks (uneven all-to-all) are skipped, and a step
with nothing to send or receive is not a round.
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm
from ringzero.plan.comm.schedules import peers


def all_to_all(c: Comm, sbuf: Buffer, sbounds: Sequence[int], rbuf: Buffer, rbounds: Sequence[int]) -> None:
    """n-1 pairwise steps; at each, send chunk `dst` to dst and receive chunk `src` from src."""
    n, r = c.size, c.rank
    c.copy(rbuf[rbounds[r]:rbounds[r + 1]], sbuf[sbounds[r]:sbounds[r + 1]])
    for s in range(1, n):
        dst, src = peers(n, r, s)
        c.sendrecv([(dst, sbuf[sbounds[dst]:sbounds[dst + 1]])],
                   [(src, rbuf[rbounds[src]:rbounds[src + 1]])])
