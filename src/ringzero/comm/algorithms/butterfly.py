"""Recursive doubling: the butterfly all-reduce and the recursive-doubling all-gather.

The butterfly all-reduce: in round k every rank pairs with the rank whose number
differs in bit k (rank XOR 2^k) — GPU 0 with 1 and 2 with 3, then 0 with 2 and 1 with 3 — and the
pair swap and combine what they hold. After log2 n rounds the result is everywhere, with no separate
broadcast phase (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
operations in MPICH", §4.1 for all-reduce, §3.1 for all-gather).

- all-reduce: every round swaps the WHOLE buffer and reduces it: log2 n rounds, S·log2 n bytes
  sent, received and reduced per rank (latency-optimal, not bandwidth-optimal; S·log2 N in all).
- all-gather: round k swaps the contiguous block of 2^k chunks gathered so far (the chunks of the
  ranks that agree with this one above bit k): log2 n rounds, and every rank receives exactly the
  S - s_r bytes it lacks. Chunks may be uneven: blocks are ranges of `bounds`, never sizes × index.

Ranks that are not a power of two (MPICH's fold). Let p be the largest power of two <= n and
rem = n - p. Among the first 2·rem ranks, each even rank 2i is folded into its odd neighbour 2i+1
before the power-of-two algorithm and served by it afterwards; the p survivors are renumbered
v = i for the odd ranks 2i+1 and v = r - rem for the ranks r >= 2·rem.
- all-reduce: rank 2i sends its whole buffer to 2i+1, which reduces it in; the survivors run
  recursive doubling; 2i+1 sends the result back (2 extra rounds, S more bytes each way).
- all-gather: rank 2i sends its chunk to 2i+1; survivor v now owns the chunks of original ranks
  [first(v), first(v+1)) with first(v) = 2v for v < rem, v + rem otherwise — a contiguous range,
  so the survivors' blocks are still contiguous buffer ranges and recursive doubling runs on them
  unchanged; 2i+1 finally sends rank 2i everything but its own chunk (two messages: the parts
  before and after it), so every rank again receives exactly S - s_r bytes.
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm
from ringzero.plan.comm.chunks import pof2_floor
from ringzero.comm.algorithms.reducing import exchange_reduce


class Fold:
    """Where one rank stands in MPICH's fold of n ranks onto p = pof2_floor(n) survivors."""

    __slots__ = ("n", "rank", "p", "rem", "vrank")

    def __init__(self, n: int, rank: int) -> None:
        self.n, self.rank = n, rank
        self.p = pof2_floor(n)
        self.rem = n - self.p
        if rank < 2 * self.rem:
            self.vrank = rank // 2 if rank % 2 else -1
        else:
            self.vrank = rank - self.rem

    @property
    def extra(self) -> bool:
        """An even rank of the first 2·rem: folded into rank + 1, idle during the core algorithm."""
        return self.vrank < 0

    @property
    def keeper(self) -> bool:
        """An odd rank of the first 2·rem: stands for itself and for rank - 1."""
        return self.rank < 2 * self.rem and not self.extra

    def real(self, v: int) -> int:
        """The group rank of survivor v."""
        return 2 * v + 1 if v < self.rem else v + self.rem

    def first(self, v: int) -> int:
        """The lowest original rank survivor v stands for (first(p) == n)."""
        return 2 * v if v < self.rem else v + self.rem


def folded_out(c: Comm, buf: Buffer, count: int, lo: int, hi: int) -> None:
    """The fold on an even rank of the first 2·rem: hand the whole buffer to rank + 1, then
    receive buf[lo:hi] back from it once the survivors are done."""
    c.sendrecv([(c.rank + 1, buf[:count])])
    c.sendrecv(recvs=[(c.rank + 1, buf[lo:hi])])


def absorb(c: Comm, buf: Buffer, scratch: Buffer, peer: int) -> None:
    """Receive `peer`'s copy of `buf` into `scratch` and reduce it in (the fold's pre-step)."""
    exchange_reduce(c, peer, buf, scratch).wait()


def gather_doubling(c: Comm, buf: Buffer, sb: Sequence[int], f: Fold) -> None:
    """Recursive-doubling all-gather among the p survivors.

    `sb` (length p+1) gives survivor v's block as buf[sb[v]:sb[v+1]]; survivor v holds its block on
    entry and all of buf[sb[0]:sb[p]] on exit. In the round with distance `mask` it holds the
    aligned block of `mask` survivors starting at v - v % mask and swaps it for its partner's.
    """
    v, mask = f.vrank, 1
    while mask < f.p:
        mine = v - v % mask
        theirs = mine ^ mask
        peer = f.real(v ^ mask)
        c.sendrecv([(peer, buf[sb[mine]:sb[mine + mask]])], [(peer, buf[sb[theirs]:sb[theirs + mask]])])
        mask <<= 1


def all_reduce(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Butterfly all-reduce: log2 p rounds of whole-buffer swap-and-reduce (+2 when folded)."""
    n, r = c.size, c.rank
    if n == 1:
        return
    count = bounds[n]
    f = Fold(n, r)
    if f.extra:
        return folded_out(c, buf, count, 0, count)
    scratch = c.empty(count)
    if f.keeper:
        absorb(c, buf[:count], scratch, r - 1)
    mask = 1
    while mask < f.p:
        peer = f.real(f.vrank ^ mask)
        # Both partners reduce the same two operands (op is commutative), so they stay bit-identical.
        # Not `exchange_reduce`: the buffer sent is the one reduced into.
        c.sendrecv([(peer, buf[:count])], [(peer, scratch)])
        c.reduce(buf[:count], scratch)
        mask <<= 1
    if f.keeper:
        c.sendrecv([(r - 1, buf[:count])])


def all_gather(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Recursive-doubling all-gather of uneven chunks indexed by rank (fold as in the module doc)."""
    n, r = c.size, c.rank
    if n == 1:
        return
    f = Fold(n, r)
    if f.extra:
        c.sendrecv([(r + 1, buf[bounds[r]:bounds[r + 1]])])
        c.sendrecv(recvs=[(r + 1, buf[:bounds[r]]), (r + 1, buf[bounds[r + 1]:bounds[n]])])
        return
    if f.keeper:
        c.sendrecv(recvs=[(r - 1, buf[bounds[r - 1]:bounds[r]])])
    gather_doubling(c, buf, [bounds[f.first(v)] for v in range(f.p + 1)], f)
    if f.keeper:
        c.sendrecv([(r - 1, buf[:bounds[r - 1]]), (r - 1, buf[bounds[r]:bounds[n]])])
