"""Binomial-tree traffic (Thakur, Rabenseifner & Gropp 2005 §3).

With vr = (rank - root) mod n, top(vr) = index of vr's lowest set bit (ceil(log2 n) for the root)
and c(vr) = #{k < top(vr) : vr + 2^k < n} children, for a payload of S bytes:

- reduce: rank vr receives and reduces c(vr)·S in c(vr) messages, and sends S once unless it is the
  root; rounds = c(vr) + [vr != 0]. The root has c = ceil(log2 n): ceil(log2 n)·S received.
- broadcast: the mirror: receives S once (not the root), sends c(vr)·S; rounds the same.
- all_reduce: reduce to 0 plus broadcast from 0, so rank 0 receives and sends ceil(log2 n)·S
  (the root path moves S in each of ~2 log2 N rounds) and every other rank receives and
  sends (c(vr) + 1)·S.
- gather: child vr + 2^k brings its subtree's chunks, the absolute ranks
  (vr + 2^k + root .. min(vr + 2^(k+1), n) - 1 + root) mod n; summed over the tree the root receives
  S - (its own chunk), i.e. (n-1)/n·S for equal chunks. A range that wraps past rank n-1 is two
  messages (both non-empty pieces), as `comm.algorithms.tree` sends it.
- scatter: the mirror of gather.

Zero-size messages are not counted (as the Comm drops them), nor is a step in which a rank moves
nothing, so every count is per non-empty message; the tally below follows the tree step by step.
"""

from __future__ import annotations

from ringzero.plan.comm.volume import Call, Tally, Volume


def _top(vr: int, n: int) -> int:
    return (vr & -vr).bit_length() - 1 if vr else (n - 1).bit_length()


def _n_children(vr: int, n: int) -> int:
    return sum(1 for k in range(_top(vr, n)) if vr + (1 << k) < n)


def _range_pieces(sizes, root: int, lo: int, hi: int) -> list[int]:
    """Element counts of the messages carrying relative ranks [lo, hi): one, or two if it wraps
    (`sizes` has the `chunks.Chunks` interface)."""
    n = len(sizes)
    a = (lo + root) % n
    b = a + hi - lo
    if b <= n:
        return [sizes.span(a, b)]
    return [sizes.span(a, n), sizes.span(0, b - n)]


def whole(n: int, count: int, itemsize: int, vr: int, up: bool) -> Volume:
    """A binomial reduce (`up`) or broadcast of `count` elements, for relative rank vr of n ranks.

    Shared with `plan.comm.volumes.hierarchical`; n == 1 or count == 0 gives zeros.
    """
    t = Tally(itemsize)
    kids = _n_children(vr, n)
    if not up and vr:
        t.step(recv=[count])
    for _ in range(kids):
        if up:
            t.step(recv=[count], reduce=count)
        else:
            t.step(send=[count])
    if up and vr:
        t.step(send=[count])
    return t.volume()


def reduce(call: Call, rank: int) -> Volume:
    return whole(call.n, call.count, call.itemsize, (rank - call.root) % call.n, up=True)


def broadcast(call: Call, rank: int) -> Volume:
    return whole(call.n, call.count, call.itemsize, (rank - call.root) % call.n, up=False)


def all_reduce(call: Call, rank: int) -> Volume:
    return (whole(call.n, call.count, call.itemsize, rank, up=True)
            + whole(call.n, call.count, call.itemsize, rank, up=False))


def _ranges(call: Call, rank: int):
    """(pieces from/to the parent or None, [pieces of each child's subtree])."""
    n, root = call.n, call.root
    vr = (rank - root) % n
    top = _top(vr, n)
    kids = [_range_pieces(call.chunks, root, vr + (1 << k), min(vr + (1 << (k + 1)), n))
            for k in range(top) if vr + (1 << k) < n]
    parent = _range_pieces(call.chunks, root, vr, min(vr + (1 << top), n)) if vr else None
    return parent, kids


def gather(call: Call, rank: int) -> Volume:
    parent, kids = _ranges(call, rank)
    t = Tally(call.itemsize)
    for pieces in kids:
        t.step(recv=pieces)
    if parent is not None:
        t.step(send=parent)
    return t.volume()


def scatter(call: Call, rank: int) -> Volume:
    parent, kids = _ranges(call, rank)
    t = Tally(call.itemsize)
    if parent is not None:
        t.step(recv=parent)
    for pieces in kids:
        t.step(send=pieces)
    return t.volume()
