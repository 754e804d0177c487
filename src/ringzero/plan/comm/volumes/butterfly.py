"""Recursive-doubling traffic: butterfly all-reduce and recursive-doubling all-gather.

Thakur, Rabenseifner & Gropp 2005 §4.1 and §3.1 (the butterfly all-reduce: log2 N rounds, S·log2 N
traffic). Mirrors `ringzero.comm.algorithms.butterfly`. Notation: n ranks,
S = count·itemsize bytes, s_r = bytes of rank r's chunk, p = largest power of two <= n,
rem = n - p.

Power-of-two n (no fold), every rank:
- all-reduce: rounds = log2 n; bytes sent = received = reduced = S·log2 n; log2 n messages each way.
- all-gather: rounds = log2 n; bytes received = S - s_r; bytes sent = Σ_k (bytes of the aligned
  block of 2^k chunks holding chunk r), which is (n-1)/n·S when chunks are equal.

Other n (MPICH's fold): ranks r >= 2·rem are plain survivors (the formulas above with p for n).
- all-reduce: an even r < 2·rem sends S and receives S, 1 message each, 2 rounds, reduces nothing;
  its odd partner adds one receive + reduce of S before and one send of S after its log2 p
  rounds: S·(log2 p + 1) each way and reduced, log2 p + 2 rounds.
- all-gather: an even r < 2·rem sends s_r and receives S - s_r (in up to two messages: the parts
  before and after its chunk); its odd partner first receives s_{r-1}, then gathers the survivor
  blocks, then sends S - s_{r-1}. Every rank still receives exactly S - s_r. The per-round block
  sizes depend on the chunk sizes, so `all_gather` tallies them round by round.
"""

from __future__ import annotations

from ringzero.plan.comm.chunks import pof2_floor
from ringzero.plan.comm.volume import Call, Tally, Volume


def fold(n: int, rank: int) -> tuple[int, int, int]:
    """(p, rem, v): survivor number v of `rank`, -1 for an even rank folded into rank + 1."""
    p = pof2_floor(n)
    rem = n - p
    if rank < 2 * rem:
        return p, rem, (rank // 2 if rank % 2 else -1)
    return p, rem, rank - rem


def first_rank(v: int, rem: int) -> int:
    """The lowest original rank survivor v stands for: 2v for a folded pair, v + rem otherwise."""
    return 2 * v if v < rem else v + rem


def survivor_bounds(bound, rem: int):
    """Offset of survivor u's first chunk, `bound` giving the offset of an original rank's chunk."""
    return lambda u: bound(first_rank(u, rem))


def doubling_rounds(t: Tally, sb, p: int, v: int) -> None:
    """Survivor v's recursive-doubling rounds over survivor blocks, sb(u) = the offset of block u
    (u = 0..p), in elements: log2 p lookups, never a list of the p blocks."""
    mask = 1
    while mask < p:
        mine = v - v % mask
        theirs = mine ^ mask
        t.step([sb(mine + mask) - sb(mine)], [sb(theirs + mask) - sb(theirs)])
        mask <<= 1


def all_reduce(call: Call, rank: int) -> Volume:
    p, rem, v = fold(call.n, rank)
    S, k = call.count * call.itemsize, p.bit_length() - 1
    if v < 0:  # folded out: hand the buffer over, get the result back
        return Volume(bytes_sent=S, bytes_recv=S, messages_sent=1, messages_recv=1, rounds=2)
    extra = 1 if rank < 2 * rem else 0  # the keeper's receive-and-reduce and its send back
    return Volume(bytes_sent=S * (k + extra), bytes_recv=S * (k + extra), messages_sent=k + extra,
                  messages_recv=k + extra, rounds=k + 2 * extra, bytes_reduced=S * (k + extra))


def all_gather(call: Call, rank: int) -> Volume:
    n, b = call.n, call.chunks.bound
    p, rem, v = fold(n, rank)
    t = Tally(call.itemsize)
    if v < 0:
        t.step(send=[call.sizes[rank]])
        t.step(recv=[b(rank), b(n) - b(rank + 1)])
        return t.volume()
    keeper = rank < 2 * rem
    if keeper:
        t.step(recv=[call.sizes[rank - 1]])
    doubling_rounds(t, survivor_bounds(b, rem), p, v)
    if keeper:
        t.step(send=[b(rank - 1), b(n) - b(rank)])
    return t.volume()
