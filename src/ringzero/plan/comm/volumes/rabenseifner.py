"""Recursive-halving reduce-scatter and Rabenseifner all-reduce traffic.

Rabenseifner 2004 (ICCS); Thakur, Rabenseifner & Gropp 2005 §4.1-4.2 (about 2·log2 N rounds,
bandwidth close to Ring's). Mirrors `ringzero.comm.algorithms.rabenseifner`.
Notation: n ranks, S = count·itemsize bytes, p = largest power of two <= n, rem = n - p.

Power-of-two n, every rank, when n divides the count (equal chunks of S/n):
- reduce-scatter (recursive halving): round k swaps half of the current range, S/2^(k+1):
  rounds = log2 n; bytes sent = received = reduced = S·(1/2 + 1/4 + … + 1/n) = (n-1)/n·S.
- Rabenseifner all-reduce = that + the recursive-doubling all-gather of the same chunks:
  rounds = 2·log2 n; bytes sent = received = 2(n-1)/n·S; bytes reduced = (n-1)/n·S.
When chunks differ by an element (or some are empty) the halves differ too, so the functions below
tally the exact block sizes round by round (an empty exchange is no message and no round).

Other n (MPICH's fold): an even rank r < 2·rem sends its whole buffer S (1 round) and later
receives its result — its chunk s_r for reduce-scatter, the whole S for all-reduce (1 round); it
reduces nothing. Its odd partner first receives S and reduces it, runs the power-of-two algorithm
on the p survivors' blocks, then sends that result back. Reduce-scatter keeps the rank-indexed
chunks (a folded pair's survivor owns both chunks); all-reduce re-cuts the buffer into
chunk_sizes(count, p) for the survivors.
"""

from __future__ import annotations

from ringzero.plan.comm.chunks import Chunks
from ringzero.plan.comm.volume import Call, Tally, Volume
from ringzero.plan.comm.volumes.butterfly import doubling_rounds, fold, survivor_bounds


def halving_rounds(t: Tally, sb, p: int, v: int) -> None:
    """Survivor v's recursive-halving rounds over survivor blocks, sb(u) = the offset of block u
    (u = 0..p), in elements."""
    lo, hi, mask = 0, p, p >> 1
    while mask:
        mid = lo + mask
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        kept = sb(keep[1]) - sb(keep[0])
        t.step([sb(give[1]) - sb(give[0])], [kept], reduce=kept)
        lo, hi = keep
        mask >>= 1


def reduce_scatter(call: Call, rank: int) -> Volume:
    n, count = call.n, call.count
    p, rem, v = fold(n, rank)
    t = Tally(call.itemsize)
    if v < 0:
        t.step(send=[count])
        t.step(recv=[call.sizes[rank]])
        return t.volume()
    keeper = rank < 2 * rem
    if keeper:
        t.step(recv=[count], reduce=count)
    halving_rounds(t, survivor_bounds(call.chunks.bound, rem), p, v)
    if keeper:
        t.step(send=[call.sizes[rank - 1]])
    return t.volume()


def all_reduce(call: Call, rank: int) -> Volume:
    count = call.count
    p, rem, v = fold(call.n, rank)
    t = Tally(call.itemsize)
    if v < 0:
        t.step(send=[count])
        t.step(recv=[count])
        return t.volume()
    keeper = rank < 2 * rem
    if keeper:
        t.step(recv=[count], reduce=count)
    sb = Chunks(count, p).bound
    halving_rounds(t, sb, p, v)
    doubling_rounds(t, sb, p, v)
    if keeper:
        t.step(send=[count])
    return t.volume()
