"""Naive ("direct") versions of all eight collectives: every message goes straight to its destination.

The rooted collectives talk to their root directly: broadcast and scatter are the root sending to
each rank, reduce and gather are each rank sending to the root. The all-* collectives go through
rank 0, the parameter-server shape (Li et al. 2014): all-reduce = reduce to rank 0 + broadcast from
it, all-gather = gather + broadcast and reduce-scatter = reduce + scatter (the identities by which
the MPI standard defines them). All-to-all is the one fully
distributed case: every rank posts its n-1 sends and n-1 receives at once (MPICH's
"isend-irecv" all-to-all for medium messages, Thakur, Rabenseifner & Gropp 2005 §3.6).

Rounds: every logical step is ONE `exchange`, so the order in which a rank posts its messages can
never deadlock, and each step is one round. Reduce, broadcast, gather, scatter and all-to-all take
1 round; all-reduce, all-gather and reduce-scatter take 2 (to the root, then back). Cost in α-β-γ
terms with S the buffer's bytes: the root pays (n-1) messages per round and carries (n-1)·S in and
(n-1)·S out for all-reduce (2(n-1)·S for the whole system, often rounded to 2·N·S) while every other rank
moves only S each way, so the root's link is the bottleneck: T ≈ 2(n-1)(α + βS) + (n-1)γS.

Any world size works as is (nothing here needs a power of two). The root receives every
contribution into scratch in one exchange and only then reduces them, in rank order (the root's own
value first), so the root holds (n-1)·S of scratch: the price of posting everything at once.
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm


ROOT = 0
"""The rank that plays the parameter server in all-reduce, all-gather and reduce-scatter."""


def _others(n: int, root: int) -> list[int]:
    return [p for p in range(n) if p != root]


def _reduce_to_root(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """One round: every rank sends its whole buffer to `root`, which reduces them into `buf`."""
    lo, hi = bounds[0], bounds[-1]
    if c.rank != root:
        c.sendrecv([(root, buf[lo:hi])], [])
        return
    peers, count = _others(c.size, root), hi - lo
    scratch = c.empty(len(peers) * count)  # (n-1)·S: all contributions arrive in one exchange
    c.sendrecv([], [(p, scratch[k * count:(k + 1) * count]) for k, p in enumerate(peers)])
    for k in range(len(peers)):
        c.reduce(buf[lo:hi], scratch[k * count:(k + 1) * count])


def _broadcast_from_root(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """One round: `root` sends its whole buffer to every other rank."""
    lo, hi = bounds[0], bounds[-1]
    if c.rank == root:
        c.sendrecv([(p, buf[lo:hi]) for p in _others(c.size, root)], [])
    else:
        c.sendrecv([], [(root, buf[lo:hi])])


def _gather_to_root(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """One round: every rank sends its chunk to `root`, which receives each straight into place."""
    r = c.rank
    if r != root:
        c.sendrecv([(root, buf[bounds[r]:bounds[r + 1]])], [])
    else:
        c.sendrecv([], [(p, buf[bounds[p]:bounds[p + 1]]) for p in _others(c.size, root)])


def _scatter_from_root(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """One round: `root` sends chunk p to each rank p, which receives it in place."""
    r = c.rank
    if r == root:
        c.sendrecv([(p, buf[bounds[p]:bounds[p + 1]]) for p in _others(c.size, root)], [])
    else:
        c.sendrecv([], [(root, buf[bounds[r]:bounds[r + 1]])])


def reduce(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Every rank sends its whole buffer to `root`, which reduces the n-1 arrivals: 1 round.

    The root receives (n-1)·S and reduces (n-1)·S; every other rank sends S.
    """
    if c.size > 1:
        _reduce_to_root(c, buf, bounds, root)


def broadcast(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """`root` sends its whole buffer to each of the n-1 others in one step: 1 round, (n-1)·S out."""
    if c.size > 1:
        _broadcast_from_root(c, buf, bounds, root)


def gather(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """Every rank sends its chunk straight to `root`: 1 round; the root receives S - own chunk."""
    if c.size > 1:
        _gather_to_root(c, buf, bounds, root)


def scatter(c: Comm, buf: Buffer, bounds: Sequence[int], root: int) -> None:
    """`root` sends chunk p straight to each rank p: 1 round; the root sends S - own chunk."""
    if c.size > 1:
        _scatter_from_root(c, buf, bounds, root)


def all_reduce(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Parameter-server all-reduce: reduce to rank 0, then broadcast from it (Li et al. 2014's shape).

    2 rounds. Rank 0 receives and sends (n-1)·S in n-1 messages each way and reduces (n-1)·S;
    every other rank sends S and receives S.
    """
    if c.size > 1:
        _reduce_to_root(c, buf, bounds, ROOT)
        _broadcast_from_root(c, buf, bounds, ROOT)


def all_gather(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Gather to rank 0, then rank 0 broadcasts the whole assembled buffer (all-gather = gather +
    broadcast). 2 rounds.

    Rank 0 sends the whole S to everyone, own chunk included: one message per rank instead of two
    (the pieces before and after the receiver's chunk), which is the naive trade of bytes for α.
    Rank r sends its chunk and receives S; rank 0 receives S - chunk 0 and sends (n-1)·S.
    """
    if c.size > 1:
        _gather_to_root(c, buf, bounds, ROOT)
        _broadcast_from_root(c, buf, bounds, ROOT)


def reduce_scatter(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Reduce the whole buffer to rank 0, then rank 0 scatters chunk r to rank r (reduce-scatter =
    reduce + scatter). 2 rounds.

    Rank r sends S and receives its chunk; rank 0 receives (n-1)·S, reduces (n-1)·S and sends
    S - chunk 0.
    """
    if c.size > 1:
        _reduce_to_root(c, buf, bounds, ROOT)
        _scatter_from_root(c, buf, bounds, ROOT)


def all_to_all(c: Comm, sbuf: Buffer, sbounds: Sequence[int], rbuf: Buffer, rbounds: Sequence[int]) -> None:
    """Every rank posts all n-1 sends and n-1 receives in one exchange: 1 round.

    Rank r sends Σ_j≠r of its chunks and receives Σ_i≠r of what the others send it, n-1 messages
    each way (fewer when some are empty). Its own chunk is copied locally. With everything posted
    at once the network sees all n(n-1) messages together: fine for small n, congested for large.
    """
    n, r = c.size, c.rank
    c.copy(rbuf[rbounds[r]:rbounds[r + 1]], sbuf[sbounds[r]:sbounds[r + 1]])
    if n == 1:
        return
    peers = _others(n, r)
    c.sendrecv([(p, sbuf[sbounds[p]:sbounds[p + 1]]) for p in peers],
               [(p, rbuf[rbounds[p]:rbounds[p + 1]]) for p in peers])
