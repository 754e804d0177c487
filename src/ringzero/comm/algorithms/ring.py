"""Ring reduce-scatter, all-gather and all-reduce, pipelined in segments.

Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009.
Ranks form the ring r -> r+1 (mod n). All-reduce is reduce-scatter followed by all-gather: 2(n-1)
steps, each moving one chunk of S/n bytes, so every rank sends 2(n-1)/n·S — bandwidth-optimal and
independent of n. Works for any n (no power-of-two requirement) and any count: chunks follow
`plan.comm.chunks.chunk_bounds`, so they differ by at most one element and may be empty.

Pipelining: each chunk is cut into segments of `SEGMENT_BYTES` (its *pieces*), and a *unit* is one
segment of one step. A unit's send waits only for the unit that produced its data (the same segment
of the previous step), never for the whole step, so the next segment is on the wire while this one
is reduced. The cut and the schedule depend only on (n, rank, chunk bounds), so they are computed
once and cached; the buffer is split into all its pieces with one `split` call per collective.

When to post receives depends on what else runs. Alone (a benchmark, a blocking call), the cost
that matters on CPU ranks is gloo's rendezvous per message (the sender announces, the receiver
answers, then the data moves: three socket writes and as many thread wake-ups); posting each
receive just before it is awaited (`LOOKAHEAD` 1) used the least CPU per all-reduce on 4 gloo
ranks of a 2-core machine (README; user + sys of `/usr/bin/time -v ringzero bench comm --nproc 4
--collective all_reduce --algorithm ring` for each `LOOKAHEAD`). Beside computation (the training engine's communication
thread, `comm.config.beside_compute`) this thread often waits for the GIL or a core, so receives
are posted early — `DEPTH` reduce-scatter receives ahead into scratch slots, every all-gather
receive at once, straight into place — and gloo's I/O thread moves the data meanwhile: ZeRO-3 on
2 ranks stepped in 224-242 ms that way against 240-268 ms with lookahead 1 (`ringzero bench train
--nproc 2 --suites zero3`; lookahead 1: the same with `parallel.comm_queue`'s
`initializer=mark_beside_compute` removed).

NCCL serialises separately issued point-to-point calls on one stream, so a receive posted ahead of
a send would block the ring there; on such backends (`c.async_p2p` false) each unit's send and
receive go together in one batch, in lockstep. The explainer's symbolic ranks run that path too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence, cast

from ringzero.comm.protocol import AsyncComm, Buffer, Comm
from ringzero.plan.comm.chunks import SEGMENT_BYTES, segments
from ringzero.comm.config import beside_compute

LOOKAHEAD = 1
"""Receives in flight when the ring runs alone, counting the awaited one (1: post just before it)."""
DEPTH = 8
"""Reduce-scatter receives in flight beside computation (the all-gather posts all of its own)."""
Piece = tuple[int, int]
"""A piece's (lo, hi) in the buffer."""
Unit = tuple[int, int, int, int, bool]
"""(step, send piece, recv piece, dep, opens_round): see `_plan`."""


@lru_cache(maxsize=512)
def _plan(n: int, r: int, bounds: tuple[int, ...], shift: int, seg: int) -> tuple[tuple[Piece, ...], tuple[Unit, ...]]:
    """(offsets, units): the pieces and the units of one ring phase, in posting order.

    `offsets[k]` is piece k's (lo, hi): every chunk's segments, in buffer order. A unit is
    (step, send piece, recv piece, dep, opens_round) with -1 for "no message" and `dep` the unit
    whose received piece this unit forwards (-1: the rank's own data). At step s rank r sends chunk
    (r + shift - s) and receives chunk (r + shift - s - 1). `opens_round` marks the unit whose
    first message opens step s's round for the traffic meter.
    """
    offsets, chunk_pieces = [], []
    for k in range(n):
        lo, segs = bounds[k], segments(bounds[k + 1] - bounds[k], seg)
        chunk_pieces.append(list(range(len(offsets), len(offsets) + len(segs))))
        offsets += [(lo + a, lo + b) for a, b in segs]
    units, prev = [], {}
    for s in range(n - 1):
        out = chunk_pieces[(r + shift - s) % n]
        inc = chunk_pieces[(r + shift - s - 1) % n]
        cur = {}
        for k in range(max(len(out), len(inc))):
            cur[k] = len(units)
            units.append((s, out[k] if k < len(out) else -1, inc[k] if k < len(inc) else -1,
                          prev.get(k, -1), k == 0))
        prev = cur
    return tuple(offsets), tuple(units)


def _drive(c: Comm, buf: Buffer, offsets: Sequence[Piece], units: Sequence[Unit], reduce: bool) -> None:
    """Run one phase: receive (reduced into place, through scratch where the transport needs it, or
    copied into place), forward when ready."""
    if not c.async_p2p:
        return _lockstep(c, buf, offsets, units, reduce)
    c = cast(AsyncComm, c)  # async_p2p promises split, post_send and post_recv (`comm.protocol`)
    right, left = (c.rank + 1) % c.size, (c.rank - 1) % c.size
    pieces = c.split(buf, [hi - lo for lo, hi in offsets])
    nu, posted_send, done = len(units), 0, -1
    beside = beside_compute()
    if reduce:
        ahead = max(1, DEPTH if beside else LOOKAHEAD)
        seg = max((hi - lo for lo, hi in offsets), default=0)
        slots = [c.empty(seg) for _ in range(ahead)]
    else:
        ahead = nu if beside else max(1, LOOKAHEAD)
    recvs, sends = [], []
    for i in range(nu):
        while len(recvs) < min(nu, i + ahead):
            _, sp, rp, _, first = units[len(recvs)]
            if rp < 0:
                recvs.append(None)
                continue
            dst = pieces[rp]
            if reduce:
                slot = slots[len(recvs) % len(slots)]
                recvs.append(c.post_recv_reduce(left, dst, slot if len(slot) == len(dst) else slot[: len(dst)],
                                                new_round=first))
                continue
            recvs.append(c.post_recv(left, dst, new_round=first))
        while posted_send < nu and units[posted_send][3] <= done:
            _, sp, rp, _, first = units[posted_send]
            if sp >= 0:
                sends.append(c.post_send(right, pieces[sp], new_round=first and rp < 0))
            posted_send += 1
        if recvs[i] is not None:
            recvs[i].wait()             # reduced into its piece by then, when `reduce`
        done = i
    for w in sends:
        w.wait()


def _lockstep(c: Comm, buf: Buffer, offsets: Sequence[Piece], units: Sequence[Unit], reduce: bool) -> None:
    right, left = (c.rank + 1) % c.size, (c.rank - 1) % c.size
    scratch = c.empty(max((hi - lo for lo, hi in offsets), default=0)) if reduce else None
    for _, sp, rp, _, first in units:
        sends = [(right, buf[offsets[sp][0]:offsets[sp][1]])] if sp >= 0 else []
        rlo, rhi = offsets[rp] if rp >= 0 else (0, 0)
        dst = scratch[: rhi - rlo] if reduce else buf[rlo:rhi]
        c.sendrecv(sends, [(left, dst)] if rp >= 0 else [], new_round=first)
        if reduce and rp >= 0:
            c.reduce(buf[rlo:rhi], dst)


def _segment_elems(c: Comm) -> int:
    return max(1, SEGMENT_BYTES // c.itemsize)


def _phase(c: Comm, buf: Buffer, bounds: Sequence[int], shift: int, reduce: bool) -> None:
    if c.size > 1:
        offsets, units = _plan(c.size, c.rank, tuple(bounds), shift, _segment_elems(c))
        _drive(c, buf, offsets, units, reduce)


def reduce_scatter(c: Comm, buf: Buffer, bounds: Sequence[int], shift: int = -1) -> None:
    """After n-1 steps rank r holds chunk (r + shift + 1) mod n fully reduced in `buf`.

    At step s rank r sends chunk (r + shift - s) to its right neighbour and reduces chunk
    (r + shift - s - 1), received from its left neighbour, into its own copy. `shift=-1` leaves
    chunk r on rank r (reduce_scatter's contract); all-reduce uses `shift=0`, the textbook walk-through
    of the ring on GPUs A-D (step 1: a0 -> B, b1 -> C, c2 -> D, d3 -> A).
    """
    _phase(c, buf, bounds, shift, reduce=True)


def all_gather(c: Comm, buf: Buffer, bounds: Sequence[int], shift: int = 0) -> None:
    """Rank r starts with chunk (r + shift) mod n; after n-1 steps every rank holds every chunk.

    At step s rank r forwards chunk (r + shift - s) to its right neighbour and receives chunk
    (r + shift - s - 1) from its left one, straight into place.
    """
    _phase(c, buf, bounds, shift, reduce=False)


def all_reduce(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """Reduce-scatter then all-gather on the ring (Patarasuk & Yuan 2009): 2(n-1) steps."""
    reduce_scatter(c, buf, bounds, shift=0)
    all_gather(c, buf, bounds, shift=1)
