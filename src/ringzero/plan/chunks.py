"""How a buffer of `count` elements is cut into `n` chunks, shared by the collectives and the planner.

The first `count % n` chunks get one element more (as `torch.tensor_split` and MPICH's
reduce-scatter-block do), so chunk sizes differ by at most one and any count works, including 0
and counts smaller than `n` (trailing chunks are then empty).
"""

from __future__ import annotations


def chunk_sizes(count: int, n: int) -> list[int]:
    """Sizes of the `n` chunks of a `count`-element buffer; they sum to `count`."""
    if n < 1 or count < 0:
        raise ValueError(f"chunk_sizes needs n >= 1 and count >= 0, got n={n}, count={count}")
    base, extra = divmod(count, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def bounds_from_sizes(sizes: list[int]) -> list[int]:
    """Offsets [0, s0, s0+s1, ..., total] (length n+1) of consecutive chunks."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def chunk_bounds(count: int, n: int) -> list[int]:
    """Offsets (length n+1) of the `n` near-equal chunks of a `count`-element buffer."""
    return bounds_from_sizes(chunk_sizes(count, n))


def segments(size: int, segment: int) -> list[tuple[int, int]]:
    """Split [0, size) into consecutive (lo, hi) pieces of at most `segment` elements.

    An empty range gives no pieces; `segment <= 0` means one piece (no pipelining).
    """
    if size <= 0:
        return []
    if segment <= 0 or segment >= size:
        return [(0, size)]
    return [(lo, min(lo + segment, size)) for lo in range(0, size, segment)]


def pof2_floor(n: int) -> int:
    """Largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


SEGMENT_BYTES = 1 << 20
"""Pipelining segment of the ring algorithms: each step's chunk is sent in pieces of at most this
many bytes so that sending, receiving and reducing overlap (`ringzero.comm.algorithms.ring`)."""


def n_segments(size: int, segment: int) -> int:
    """How many pieces `segments(size, segment)` makes (without building them)."""
    if size <= 0:
        return 0
    return 1 if segment <= 0 else -(-size // segment)
