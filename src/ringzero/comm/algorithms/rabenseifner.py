"""Recursive-halving reduce-scatter and Rabenseifner's all-reduce.

Rabenseifner's algorithm takes the best of both worlds, the butterfly's rounds and the ring's
bandwidth: pair up like the butterfly, but send ever smaller halves — S/2, then S/4, S/8 … — so that
the reduction is done but scattered; then run the same pairings backwards to gather the result.
Rabenseifner 2004, "Optimization of collective reduction operations" (ICCS); Thakur, Rabenseifner &
Gropp 2005, "Optimization of collective communication operations in MPICH", §4.2 (reduce-scatter by
recursive halving) and §4.1 (all-reduce as reduce-scatter + all-gather).

- reduce-scatter (recursive halving): a rank starts responsible for all p chunks. In round k it
  pairs with the rank at distance p/2^(k+1) (rank XOR that distance), keeps the half of its current
  chunk range on its own side, sends the other half to its partner, and reduces the partner's copy
  of the kept half into its own. After log2 p rounds rank r holds chunk r reduced over all ranks.
  With equal chunks each rank sends, receives and reduces (p-1)/p·S in log2 p rounds.
- all-reduce: that reduce-scatter, then the recursive-doubling all-gather
  (`butterfly.gather_doubling`), distances 1, 2, 4 … — 2·log2 n rounds and exactly 2(n-1)/n·S bytes
  each way per rank when n divides the count: Ring's bandwidth with logarithmically many rounds.

Ranks that are not a power of two (MPICH's fold; `butterfly.Fold`). p = largest power of two <= n,
rem = n - p. Among the first 2·rem ranks each even rank 2i sends its whole buffer to 2i+1, which
reduces it in, and sits out; the p survivors (2i+1 -> i, r >= 2·rem -> r - rem) run the
power-of-two algorithm; at the end 2i+1 gives rank 2i its result.
- reduce-scatter: the chunks stay indexed by original rank and may be uneven. Survivor v owns the
  chunks of the original ranks it stands for, [first(v), first(v+1)) — both chunks 2i and 2i+1 for
  a folded pair — a contiguous range, so halving works on survivor blocks unchanged. Post-step:
  2i+1 sends chunk 2i to rank 2i.
- all-reduce: the algorithm is free to cut the buffer as it likes, so the survivors use their own
  near-equal chunks, `chunk_bounds(count, p)` over the whole buffer (as MPICH's
  reduce_scatter_allgather all-reduce does with count/pof2), not the n-way `bounds` it is handed.
  Post-step: 2i+1 sends the whole result to rank 2i. Folded ranks pay 2 more rounds and S more
  bytes each way (the keeper also reduces S more).
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm
from ringzero.plan.comm.chunks import chunk_bounds
from ringzero.comm.algorithms.butterfly import Fold, absorb, folded_out, gather_doubling
from ringzero.comm.algorithms.reducing import exchange_reduce


def _halving_steps(f: Fold) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """Survivor f.vrank's rounds: (partner survivor, kept block range, given block range)."""
    v, lo, hi, mask = f.vrank, 0, f.p, f.p >> 1
    steps = []
    while mask:
        mid = lo + mask
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        steps.append((v ^ mask, keep, give))
        lo, hi = keep
        mask >>= 1
    return steps


def scatter_halving(c: Comm, buf: Buffer, sb: Sequence[int], f: Fold, scratch: Buffer | None = None) -> None:
    """Recursive-halving reduce-scatter among the p survivors.

    `sb` (length p+1) gives survivor v's block as buf[sb[v]:sb[v+1]]; on exit survivor v holds its
    block reduced over every survivor's buffer (the rest of buf is partly reduced scratch).
    """
    steps = _halving_steps(f)
    if not steps:
        return
    # Kept ranges nest, so the first one is the largest receive.
    first_keep = steps[0][1]
    if scratch is None:
        scratch = c.empty(sb[first_keep[1]] - sb[first_keep[0]])
    for partner, (klo, khi), (glo, ghi) in steps:
        peer, size = f.real(partner), sb[khi] - sb[klo]
        exchange_reduce(c, peer, buf[sb[klo]:sb[khi]], scratch[:size], sends=[(peer, buf[sb[glo]:sb[ghi]])]).wait()


def _folded_in(c: Comm, buf: Buffer, count: int, f: Fold) -> Buffer | None:
    """The fold on a keeper: reduce rank - 1's whole buffer into its own; the scratch it used
    (reused by the halving rounds) or None on ranks that keep no partner."""
    if not f.keeper:
        return None
    scratch = c.empty(count)
    absorb(c, buf[:count], scratch, c.rank - 1)
    return scratch


def _halve(c: Comm, buf: Buffer, bounds: Sequence[int], whole: bool) -> None:
    """Both collectives: fold the ranks beyond the largest power of two in, recursive halving (the
    reduce-scatter), with `whole` recursive doubling too (the all-gather), then hand the folded-out
    rank its result: its own chunk, or with `whole` the whole buffer."""
    n, r = c.size, c.rank
    if n == 1:
        return
    count = bounds[n]
    f = Fold(n, r)
    if f.extra:
        return folded_out(c, buf, count, *((0, count) if whole else (bounds[r], bounds[r + 1])))
    scratch = _folded_in(c, buf, count, f)
    if whole:
        sb = chunk_bounds(count, f.p)
        scatter_halving(c, buf, sb, f, scratch)
        gather_doubling(c, buf, sb, f)
    else:
        scatter_halving(c, buf, [bounds[f.first(v)] for v in range(f.p + 1)], f, scratch)
    if f.keeper:
        c.sendrecv([(r - 1, buf[:count] if whole else buf[bounds[r - 1]:bounds[r]])])


def reduce_scatter(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Recursive halving over uneven, rank-indexed chunks (fold as in the module doc)."""
    _halve(c, buf, bounds, whole=False)


def all_reduce(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather."""
    _halve(c, buf, bounds, whole=True)
