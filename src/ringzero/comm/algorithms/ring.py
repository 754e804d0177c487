"""Ring reduce-scatter, all-gather and all-reduce, pipelined in segments.

Seed 000 §9.3.6 and seed 004 §2.4; Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009. Ranks form the ring r -> r+1 (mod n). All-reduce is
reduce-scatter followed by all-gather: 2(n-1) steps, each moving one chunk of S/n bytes, so every rank
sends 2(n-1)/n·S — bandwidth-optimal and independent of n. Works for any n (no power-of-two
requirement) and any count: chunks follow `plan.chunks.chunk_bounds`, so they differ by at most one
element and may be empty.

Pipelining: every step's chunk is cut into segments of `SEGMENT_BYTES`; the receive and send of the
next segment are posted before the current one is waited on and reduced, so the wire (gloo's I/O
thread or NCCL's kernels) is busy while this thread adds. Received segments land in two alternating
scratch buffers (reduce-scatter) or straight into place (all-gather): no other copies.
"""

from __future__ import annotations

from ...plan.chunks import SEGMENT_BYTES, segments


def _segment_elems(c) -> int:
    return max(1, SEGMENT_BYTES // c.itemsize)


def reduce_scatter(c, buf, bounds, shift: int = -1) -> None:
    """After n-1 steps rank r holds chunk (r + shift + 1) mod n fully reduced in `buf`.

    At step s rank r sends chunk (r + shift - s) to its right neighbour and reduces chunk
    (r + shift - s - 1), received from its left neighbour, into its own copy. `shift=-1` leaves
    chunk r on rank r (reduce_scatter's contract); all-reduce uses `shift=0`, the seed's walk-through
    (step 1: a0 -> B, b1 -> C, c2 -> D, d3 -> A).
    """
    n, r = c.size, c.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    seg = _segment_elems(c)
    units = []  # (send_lo, send_hi, recv_lo, recv_hi, first_of_step, dep), in posting order
    prev_step = {}  # segment k -> unit index that reduced segment k of the previous step's chunk
    for s in range(n - 1):
        si, ri = (r + shift - s) % n, (r + shift - s - 1) % n
        send_segs = segments(bounds[si + 1] - bounds[si], seg)
        recv_segs = segments(bounds[ri + 1] - bounds[ri], seg)
        this_step = {}
        for k in range(max(len(send_segs), len(recv_segs))):
            a = send_segs[k] if k < len(send_segs) else (0, 0)
            b = recv_segs[k] if k < len(recv_segs) else (0, 0)
            this_step[k] = len(units)
            units.append((bounds[si] + a[0], bounds[si] + a[1], bounds[ri] + b[0], bounds[ri] + b[1],
                          k == 0, prev_step.get(k, -1)))
        prev_step = this_step
    scratch = [c.empty(seg), c.empty(seg)]

    def post(i):
        slo, shi, rlo, rhi, first, _ = units[i]
        return c.exchange([(right, buf[slo:shi])], [(left, scratch[i % 2][: rhi - rlo])], new_round=first)

    pending = post(0)
    for i in range(len(units)):
        rlo, rhi = units[i][2], units[i][3]
        # Post unit i+1 before waiting on i when its send data (the same segment of the previous
        # step) is already reduced; with one segment per step it depends on unit i itself.
        early = i + 1 < len(units) and units[i + 1][5] < i
        nxt = post(i + 1) if early else None
        pending.wait()
        c.reduce(buf[rlo:rhi], scratch[i % 2][: rhi - rlo])
        if i + 1 < len(units) and not early:
            nxt = post(i + 1)
        pending = nxt


def all_gather(c, buf, bounds, shift: int = 0) -> None:
    """Rank r starts with chunk (r + shift) mod n; after n-1 steps every rank holds every chunk.

    At step s rank r forwards chunk (r + shift - s) to its right neighbour and receives chunk
    (r + shift - s - 1) from its left one, straight into place.
    """
    n, r = c.size, c.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    seg = _segment_elems(c)
    pending = []
    for s in range(n - 1):
        si, ri = (r + shift - s) % n, (r + shift - s - 1) % n
        send_segs = segments(bounds[si + 1] - bounds[si], seg)
        recv_segs = segments(bounds[ri + 1] - bounds[ri], seg)
        for k in range(max(len(send_segs), len(recv_segs))):
            sends = [(right, buf[bounds[si] + send_segs[k][0]: bounds[si] + send_segs[k][1]])] if k < len(send_segs) else []
            recvs = [(left, buf[bounds[ri] + recv_segs[k][0]: bounds[ri] + recv_segs[k][1]])] if k < len(recv_segs) else []
            # Segment k of this step's send was received as segment k of the previous step:
            # wait for exactly that one, keeping the other segments in flight.
            if s > 0 and k < len(pending) and pending[k] is not None:
                pending[k].wait()
                pending[k] = None
            handle = c.exchange(sends, recvs, new_round=(k == 0))
            if k < len(pending):
                pending[k] = handle
            else:
                pending.append(handle)
    for h in pending:
        if h is not None:
            h.wait()


def all_reduce(c, buf, bounds) -> None:
    """Reduce-scatter then all-gather on the ring (seed 000 §9.3.6): 2(n-1) steps."""
    reduce_scatter(c, buf, bounds, shift=0)
    all_gather(c, buf, bounds, shift=1)
