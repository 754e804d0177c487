"""How a buffer of `count` elements is cut into `n` chunks, shared by the collectives and the planner.

The first `count % n` chunks get one element more (as `torch.tensor_split` and MPICH's
reduce-scatter-block do), so chunk sizes differ by at most one and any count works, including 0
and counts smaller than `n` (trailing chunks are then empty).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property


def chunk_sizes(count: int, n: int) -> list[int]:
    """Sizes of the `n` chunks of a `count`-element buffer; they sum to `count`."""
    return list(Chunks(count, n))


def bounds_from_sizes(sizes: list[int]) -> list[int]:
    """Offsets [0, s0, s0+s1, ..., total] (length n+1) of consecutive chunks."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def chunk_bounds(count: int, n: int) -> list[int]:
    """Offsets (length n+1) of the `n` near-equal chunks of a `count`-element buffer."""
    return bounds_from_sizes(chunk_sizes(count, n))


@dataclass(frozen=True)
class Chunks:
    """The `n` chunk sizes of `chunk_sizes(count, n)`, without the list: chunk i holds base + 1
    elements for i < extra and base after (base, extra = divmod(count, n)), so an index, a bound,
    a sum over a range and the histogram of sizes are O(1) and the planner prices a million-rank
    collective as fast as a four-rank one."""

    count: int
    n: int

    def __post_init__(self) -> None:
        if self.n < 1 or self.count < 0:
            raise ValueError(f"chunk_sizes needs n >= 1 and count >= 0, got n={self.n}, count={self.count}")

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        base, extra = divmod(self.count, self.n)
        return (base + (1 if i < extra else 0) for i in range(self.n))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(f"chunk {i} of {self.n}")
        base, extra = divmod(self.count, self.n)
        return base + (1 if i % self.n < extra else 0)

    def bound(self, i: int) -> int:
        """Offset of chunk i (i = n: the end)."""
        base, extra = divmod(self.count, self.n)
        return i * base + min(i, extra)

    def span(self, lo: int, hi: int) -> int:
        """Elements of chunks lo..hi-1."""
        return self.bound(hi) - self.bound(lo)

    @property
    def total(self) -> int:
        return self.count

    def histogram(self) -> dict[int, int]:
        """{chunk size: how many chunks have it}."""
        base, extra = divmod(self.count, self.n)
        return {k: v for k, v in ((base + 1, extra), (base, self.n - extra)) if v}

    def nonempty(self) -> int:
        return self.n if self.count >= self.n else self.count


@dataclass(frozen=True)
class Listed:
    """Any chunk sizes, given one by one, with the `Chunks` interface (O(n) once, for the bounds)."""

    sizes: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self):
        return iter(self.sizes)

    def __getitem__(self, i):
        return self.sizes[i]

    @cached_property
    def _bounds(self) -> list[int]:
        return bounds_from_sizes(self.sizes)

    def bound(self, i: int) -> int:
        return self._bounds[i]

    def span(self, lo: int, hi: int) -> int:
        return self._bounds[hi] - self._bounds[lo]

    @property
    def total(self) -> int:
        return self._bounds[-1]

    def histogram(self) -> dict[int, int]:
        return dict(Counter(self.sizes))

    def nonempty(self) -> int:
        return sum(1 for x in self.sizes if x > 0)


def as_chunks(sizes) -> Chunks | Listed:
    """`sizes` with the `Chunks` interface (a `Chunks` stays as it is)."""
    return sizes if isinstance(sizes, (Chunks, Listed)) else Listed(tuple(sizes))


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
