"""Binomial-tree reduce, broadcast, all-reduce, gather and scatter.

Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in MPICH",
§3 (binomial broadcast, reduce, gather, scatter). The tree all-reduce is a tournament bracket: pairs
reduce upward to the top of the tree, and the answer is passed back down.

Ranks are renumbered relative to the root, vr = (rank - root) mod n. Let top(vr) be the index of
vr's lowest set bit (top(0) = ceil(log2 n)). Rank vr's children are vr + 2^k for every k < top(vr)
with vr + 2^k < n, and its parent is vr - 2^top(vr). The subtree of vr is the relative range
[vr, min(vr + 2^top(vr), n)). This tree is defined for every n, so no ranks are folded in and
nothing special happens when n is not a power of two: the missing children simply do not exist.

- reduce: at step k a rank with bit k set sends its partial result to vr - 2^k and stops; a rank
  without it receives from vr + 2^k (if that exists) and reduces. ceil(log2 n) rounds on the root,
  which receives and reduces up to ceil(log2 n)·S; a leaf sends S once.
  T = ceil(log2 n)·(α + β·S + γ·S) (Thakur et al. §3, binomial reduce).
- broadcast: the mirror image; a rank receives S from its parent, then sends S to its children,
  largest subtree first. T = ceil(log2 n)·(α + β·S).
- all_reduce: binomial reduce to rank 0, then binomial broadcast from rank 0: 2·ceil(log2 n)
  rounds, the root path moving the whole payload S in every round, so the root sends and receives
  ceil(log2 n)·S each — about 2·S·log2 N in total, the reason the ring wins on large
  tensors.
- gather: a subtree forwards its contiguous relative range of chunks to its parent, so the root
  receives (n-1)/n·S in ceil(log2 n) rounds: T = ceil(log2 n)·α + (n-1)/n·S·β (Thakur et al. §3).
- scatter: the mirror of gather.

Wrapped ranges (gather, scatter): chunks are indexed by ABSOLUTE rank and may be uneven, so a
subtree's relative range [lo, hi) is the absolute range starting at (lo + root) mod n, which wraps
past the end of the buffer when the root is not 0. It is then moved as TWO messages in the same
exchange (the tail piece [a, n), then the head piece [0, b - n)), received straight into place on
both sides: no rotated scratch buffer and no copies, at the price of one extra message (α) on the
links whose subtree straddles the end; an empty piece is not sent. `plan.comm.volumes.tree` counts
those messages the same way.

The whole buffer travels in one message per step (no segment pipelining): the tree is the
latency-bound choice for small payloads, where one message per round is what the α term wants.
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm, Handle
from ringzero.comm.algorithms.reducing import exchange_reduce


def _top(vr: int, n: int) -> int:
    """The step at which relative rank vr talks to its parent (ceil(log2 n) for the root)."""
    return (vr & -vr).bit_length() - 1 if vr else (n - 1).bit_length()


def _children(vr: int, n: int) -> list[tuple[int, int]]:
    """(k, child) for each child vr + 2^k, in increasing k (smallest subtree first)."""
    return [(k, vr + (1 << k)) for k in range(_top(vr, n)) if vr + (1 << k) < n]


def _pieces(buf: Buffer, bounds: Sequence[int], n: int, root: int, lo: int, hi: int) -> list[Buffer]:
    """The chunks of relative ranks [lo, hi) as one slice, or two when the range wraps around."""
    a = (lo + root) % n
    b = a + hi - lo
    if b <= n:
        return [buf[bounds[a]:bounds[b]]]
    return [buf[bounds[a]:bounds[n]], buf[bounds[0]:bounds[b - n]]]


def reduce(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Binomial reduce of the whole buffer to `root`; other ranks' buffers hold partial results."""
    n = c.size
    vr = (c.rank - root) % n
    if n == 1:
        return
    whole = buf[bounds[0]:bounds[-1]]
    kids = [(child + root) % n for _, child in _children(vr, n)]
    # Two scratch buffers: the next child's message arrives while this one is being reduced.
    scratch = [c.empty(bounds[-1] - bounds[0]) for _ in range(min(2, len(kids)))]

    def post(i: int) -> Handle:
        return exchange_reduce(c, kids[i], whole, scratch[i % 2])

    pending = post(0) if kids else None
    for i in range(len(kids)):
        nxt = post(i + 1) if i + 1 < len(kids) else None
        pending.wait()             # reduced into `whole` by then
        pending = nxt
    if vr:
        c.sendrecv(sends=[((vr - (1 << _top(vr, n)) + root) % n, whole)])


def broadcast(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Binomial broadcast of root's buffer: receive from the parent, then feed the children."""
    n = c.size
    vr = (c.rank - root) % n
    if n == 1:
        return
    whole = buf[bounds[0]:bounds[-1]]
    if vr:
        c.sendrecv(recvs=[((vr - (1 << _top(vr, n)) + root) % n, whole)])
    # One step per child, largest subtree first (it has the deepest chain still to run); the sends
    # only read `whole`, so all are posted before any is waited on.
    pending = [c.exchange(sends=[((child + root) % n, whole)])
               for _, child in reversed(_children(vr, n))]
    for p in pending:
        p.wait()


def all_reduce(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Binomial reduce to rank 0 then binomial broadcast from it (Thakur et al. 2005): 2·ceil(log2 n) rounds."""
    reduce(c, buf, bounds, 0)
    broadcast(c, buf, bounds, 0)


def gather(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Binomial gather: each subtree's chunks arrive in place, then go up to the parent as one range."""
    n = c.size
    vr = (c.rank - root) % n
    if n == 1:
        return
    # Children's ranges are disjoint parts of `buf`: post every receive at once (one step each).
    pending = [c.exchange(recvs=[((child + root) % n, p)
                                 for p in _pieces(buf, bounds, n, root, child, min(child + (1 << k), n))])
               for k, child in _children(vr, n)]
    for p in pending:
        p.wait()
    if vr:
        top = _top(vr, n)
        mine = _pieces(buf, bounds, n, root, vr, min(vr + (1 << top), n))
        c.sendrecv(sends=[((vr - (1 << top) + root) % n, p) for p in mine])


def scatter(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Binomial scatter: receive the subtree's chunks from the parent, hand each child its range."""
    n = c.size
    vr = (c.rank - root) % n
    if n == 1:
        return
    if vr:
        top = _top(vr, n)
        mine = _pieces(buf, bounds, n, root, vr, min(vr + (1 << top), n))
        c.sendrecv(recvs=[((vr - (1 << top) + root) % n, p) for p in mine])
    pending = [c.exchange(sends=[((child + root) % n, p)
                                 for p in _pieces(buf, bounds, n, root, child, min(child + (1 << k), n))])
               for k, child in reversed(_children(vr, n))]
    for p in pending:
        p.wait()
