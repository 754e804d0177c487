"""Who sends what to whom in the binomial-tree and recursive (doubling, halving) algorithms: the
messages `plan.comm.links` prices by node, mirroring `ringzero.comm.algorithms.tree`, `.butterfly`,
`.rabenseifner` and `.scatter_allgather` step by step.

Each function yields (step, src, dst, nbytes) for every message group rank `rank` sends or
receives in `call` (group ranks; `plan.comm.links` wraps them in its `Message` and drops the empty ones):

- tree (Thakur, Rabenseifner & Gropp 2005 §3): relative rank vr = (rank - root) mod n talks to
  children vr + 2^k (k < top(vr)) and to its parent vr - 2^top(vr); reduce and broadcast move the
  whole buffer on every edge, all_reduce is a reduce to 0 then a broadcast from 0, gather and
  scatter move a subtree's chunks (two messages where the range wraps past rank n - 1);
- butterfly all_reduce and recursive-doubling all_gather (§4.1, §3.1), recursive-halving
  reduce_scatter and Rabenseifner's all_reduce (§4.2): MPICH's fold of the ranks beyond the largest
  power of two p (even rank 2i hands its buffer to 2i + 1 and gets its result back), then the
  survivors' rounds with partner survivor v XOR mask;
- scatter_allgather broadcast (van de Geijn, §3.3): the binomial scatter of relative chunks, then
  the ring all-gather (`plan.comm.links` adds the ring, which it owns).

Pure Python: no torch.
"""

from __future__ import annotations

from typing import Iterator

from ringzero.plan.comm.chunks import Chunks
from ringzero.plan.comm.volume import Call
from ringzero.plan.comm.schedules import scatter_schedule
from ringzero.plan.comm.volumes.butterfly import fold, first_rank
from ringzero.plan.comm.volumes.tree import _range_pieces, _top

Raw = tuple[tuple, int, int, int]
"""(step, src, dst, nbytes) of one message, in group ranks."""


def _edges(n: int, vr: int) -> tuple[int | None, list[tuple[int, int]]]:
    """(parent or None, [(k, child), ...]) of relative rank vr in the binomial tree of n ranks."""
    top = _top(vr, n)
    kids = [(k, vr + (1 << k)) for k in range(top) if vr + (1 << k) < n]
    return (vr - (1 << top) if vr else None), kids


def _whole(n: int, root: int, rank: int, nbytes: int, up: bool, tag: str) -> Iterator[Raw]:
    """A binomial reduce (`up`: children to parent) or broadcast of the whole buffer."""
    vr = (rank - root) % n
    parent, kids = _edges(n, vr)
    for k, child in kids:
        c = (child + root) % n
        yield ((tag, k), c, rank, nbytes) if up else ((tag, k), rank, c, nbytes)
    if parent is not None:
        p, k = (parent + root) % n, _top(vr, n)
        yield ((tag, k), rank, p, nbytes) if up else ((tag, k), p, rank, nbytes)


def _subtrees(call: Call, rank: int, up: bool) -> Iterator[Raw]:
    """Gather (`up`) or scatter: each edge carries its subtree's chunks, one or two pieces."""
    n, root, k = call.n, call.root, call.itemsize
    vr = (rank - root) % n
    parent, kids = _edges(n, vr)
    for b, child in kids:
        c = (child + root) % n
        for size in _range_pieces(call.chunks, root, child, min(child + (1 << b), n)):
            yield (("up", b), c, rank, size * k) if up else (("down", b), rank, c, size * k)
    if parent is not None:
        top, p = _top(vr, n), (parent + root) % n
        for size in _range_pieces(call.chunks, root, vr, min(vr + (1 << top), n)):
            yield (("up", top), rank, p, size * k) if up else (("down", top), p, rank, size * k)


def tree(call: Call, rank: int) -> Iterator[Raw]:
    nbytes, c = call.count * call.itemsize, call.collective
    if c == "all_reduce":
        yield from _whole(call.n, 0, rank, nbytes, True, "up")
        yield from _whole(call.n, 0, rank, nbytes, False, "down")
    elif c in ("reduce", "broadcast"):
        yield from _whole(call.n, call.root, rank, nbytes, c == "reduce", "up" if c == "reduce" else "down")
    else:
        yield from _subtrees(call, rank, up=c == "gather")


def _real(v: int, rem: int) -> int:
    """The group rank of survivor v (`comm.algorithms.butterfly.Fold.real`)."""
    return 2 * v + 1 if v < rem else v + rem


def _doubling(p: int, rem: int, v: int, sb, rank: int, k: int) -> Iterator[Raw]:
    """Survivor v's recursive-doubling rounds over survivor blocks sb(u), in elements."""
    mask = 1
    while mask < p:
        mine, peer = v - v % mask, _real(v ^ mask, rem)
        theirs = mine ^ mask
        yield ("double", mask), rank, peer, (sb(mine + mask) - sb(mine)) * k
        yield ("double", mask), peer, rank, (sb(theirs + mask) - sb(theirs)) * k
        mask <<= 1


def _halving(p: int, rem: int, v: int, sb, rank: int, k: int) -> Iterator[Raw]:
    """Survivor v's recursive-halving rounds: give the far half of its range, receive the near one."""
    lo, hi, mask = 0, p, p >> 1
    while mask:
        mid, peer = lo + mask, _real(v ^ mask, rem)
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        yield ("halve", mask), rank, peer, (sb(give[1]) - sb(give[0])) * k
        yield ("halve", mask), peer, rank, (sb(keep[1]) - sb(keep[0])) * k
        lo, hi = keep
        mask >>= 1


def _folded(rank: int, give: int, back: list[int]) -> Iterator[Raw]:
    """An even rank of the first 2·rem: its buffer to rank + 1, its result (`back`'s pieces) from it."""
    yield ("fold_in",), rank, rank + 1, give
    for nbytes in back:
        yield ("fold_out",), rank + 1, rank, nbytes


def butterfly(call: Call, rank: int) -> Iterator[Raw]:
    """Butterfly all_reduce: the whole buffer each round."""
    p, rem, v = fold(call.n, rank)
    s = call.count * call.itemsize
    if v < 0:
        yield from _folded(rank, s, [s])
        return
    if rank < 2 * rem:
        yield ("fold_in",), rank - 1, rank, s
    mask = 1
    while mask < p:
        peer = _real(v ^ mask, rem)
        yield ("double", mask), rank, peer, s
        yield ("double", mask), peer, rank, s
        mask <<= 1
    if rank < 2 * rem:
        yield ("fold_out",), rank, rank - 1, s


def recursive_doubling(call: Call, rank: int) -> Iterator[Raw]:
    """all_gather: survivor blocks of rank-indexed chunks; a folded rank gets all but its own chunk."""
    n, b, k = call.n, call.chunks.bound, call.itemsize
    p, rem, v = fold(n, rank)
    if v < 0:
        yield from _folded(rank, call.sizes[rank] * k, [b(rank) * k, (b(n) - b(rank + 1)) * k])
        return
    keeper = rank < 2 * rem
    if keeper:
        yield ("fold_in",), rank - 1, rank, call.sizes[rank - 1] * k
    yield from _doubling(p, rem, v, lambda u: b(first_rank(u, rem)), rank, k)
    if keeper:
        yield ("fold_out",), rank, rank - 1, b(rank - 1) * k
        yield ("fold_out",), rank, rank - 1, (b(n) - b(rank)) * k


def recursive_halving(call: Call, rank: int) -> Iterator[Raw]:
    """reduce_scatter: a folded rank hands over its whole buffer and gets its own chunk back."""
    n, b, k, s = call.n, call.chunks.bound, call.itemsize, call.count * call.itemsize
    p, rem, v = fold(n, rank)
    if v < 0:
        yield from _folded(rank, s, [call.sizes[rank] * k])
        return
    keeper = rank < 2 * rem
    if keeper:
        yield ("fold_in",), rank - 1, rank, s
    yield from _halving(p, rem, v, lambda u: b(first_rank(u, rem)), rank, k)
    if keeper:
        yield ("fold_out",), rank, rank - 1, call.sizes[rank - 1] * k


def rabenseifner(call: Call, rank: int) -> Iterator[Raw]:
    """all_reduce: halving then doubling over the survivors' own near-equal cut of the buffer."""
    p, rem, v = fold(call.n, rank)
    k, s = call.itemsize, call.count * call.itemsize
    if v < 0:
        yield from _folded(rank, s, [s])
        return
    if rank < 2 * rem:
        yield ("fold_in",), rank - 1, rank, s
    sb = Chunks(call.count, p).bound
    yield from _halving(p, rem, v, sb, rank, k)
    yield from _doubling(p, rem, v, sb, rank, k)
    if rank < 2 * rem:
        yield ("fold_out",), rank, rank - 1, s


def binomial_scatter(call: Call, rank: int) -> Iterator[Raw]:
    """scatter_allgather's first half: relative rank v ends holding buffer chunk v."""
    n, root, k, sizes = call.n, call.root, call.itemsize, call.chunks
    v = (rank - root) % n
    recv, sends = scatter_schedule(n, v)
    # A step is named by its mask, the distance between the peers: each send is a round of its own.
    if recv is not None:
        peer, lo, hi = recv
        yield ("scatter", v - peer), (peer + root) % n, rank, sizes.span(lo, hi) * k
    for peer, lo, hi in sends:
        yield ("scatter", peer - v), rank, (peer + root) % n, sizes.span(lo, hi) * k


SCHEDULES = {"tree": tree, "butterfly": butterfly, "recursive_doubling": recursive_doubling,
             "recursive_halving": recursive_halving, "rabenseifner": rabenseifner}
"""Algorithm -> its messages (scatter_allgather's are `binomial_scatter` plus `plan.comm.links`' ring)."""
