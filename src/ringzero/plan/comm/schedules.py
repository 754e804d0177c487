"""Who talks to whom: communication schedules shared by the algorithms and their volume formulas.

Pure functions of (n, rank, step), like `chunks.chunk_bounds`: the algorithms in
`ringzero.comm.algorithms` move data along them, and `ringzero.plan.comm.volumes` counts the bytes they
imply; the meter tests check that the data really moved that way.
"""

from __future__ import annotations


def peers(n: int, rank: int, step: int) -> tuple[int, int]:
    """(destination, source) of `rank` at `step` (1..n-1) of the pairwise exchange."""
    if n & (n - 1) == 0:
        partner = rank ^ step
        return partner, partner
    return (rank + step) % n, (rank - step) % n


def scatter_schedule(n: int, v: int) -> tuple[tuple[int, int, int] | None, list[tuple[int, int, int]]]:
    """Relative rank v's binomial scatter: (recv (peer, lo, hi) or None, [send (peer, lo, hi), …]).

    Peers are relative ranks; lo..hi are the chunk indices [lo, hi) moved in that message.
    """
    recv, mask = None, 1
    while mask < n:
        if v & mask:
            recv = (v - mask, v, min(v + mask, n))
            break
        mask <<= 1
    sends = []
    mask >>= 1
    while mask > 0:
        if v + mask < n:
            sends.append((v + mask, v + mask, min(v + 2 * mask, n)))
        mask >>= 1
    return recv, sends
