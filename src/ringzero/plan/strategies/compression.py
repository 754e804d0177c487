"""Gradient compression on the data-parallel reduction: what each scheme sends, keeps and costs,
written once for the engine's hooks (`ringzero.parallel.compression`), their twins and the planner.

Per flat bucket of gradients (parameters p_1..p_k, `numel` elements of `itemsize` bytes):

- fp16 / bf16: the bucket cast to 16 bits and reduced so (torch DDP's `fp16_compress_hook`,
  `bf16_compress_hook`): the gradient collective at 2 bytes per element.
- PowerSGD (Vogels et al. 2019, Algorithm 1, rank R): every parameter viewed as a matrix
  (shape[0], prod(shape[1:])) of n x m; one compresses when (n + m)·r·2 < n·m, r = min(n, m, R)
  (torch's `_should_compress` with `min_compression_rate` = 2); the rest (vectors, small matrices)
  go in one plain all-reduce. Then two all-reduces: P = M·Q (Σ n·r elements) and Q = Mᵀ·P
  (Σ m·r). It keeps an error-feedback residual (the whole bucket) and Q (Σ m·r) between steps.
- top-k (Stich et al. 2018; Lin et al. 2018): each rank keeps the k = ⌈f·numel⌉ largest-magnitude
  entries of gradient + residual and all-gathers them as (int32 index, value) pairs, k·(4 +
  itemsize) bytes per rank; it keeps the residual (the whole bucket).

Under ZeRO-1/2 fp16/bf16 reduce-scatter the padded bucket at 2 bytes; PowerSGD and top-k run their
all-reduces (all-gather) on the whole bucket under ZeRO-1 and every rank keeps its shard of the
result; ZeRO-2 refuses them (it reduces every micro-batch to free the full gradient, which their
full-size residual would keep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEMES = ("none", "fp16", "bf16", "powersgd", "topk")
INDEX_BYTES = 4
"""A top-k index: int32 (a bucket holds fewer than 2^31 elements)."""
MIN_COMPRESSION_RATE = 2.0
"""torch's `PowerSGDState.min_compression_rate` default: compress a matrix when it shrinks more."""

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Compression:
    """One scheme and its parameters."""

    scheme: str = "none"
    rank: int = 4
    """PowerSGD's R."""
    fraction: float = 0.01
    """top-k's f: the share of a bucket's elements each rank sends."""

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"compression scheme {self.scheme!r} does not exist; allowed: {', '.join(SCHEMES)}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"PowerSGD rank must be an integer >= 1, got {self.rank!r}")
        if not (isinstance(self.fraction, (int, float)) and 0 < self.fraction <= 1):
            raise ValueError(f"top-k fraction must be in (0, 1], got {self.fraction!r}")

    @property
    def on(self) -> bool:
        return self.scheme != "none"

    @property
    def stateful(self) -> bool:
        """Whether it keeps an error-feedback residual (and so needs one reduction per step)."""
        return self.scheme in ("powersgd", "topk")

    @property
    def wire_itemsize(self) -> int | None:
        """The element size the gradient collective moves (None: the scheme sends its own calls)."""
        return 2 if self.scheme in ("fp16", "bf16") else None


RUNS_WITH = ("dp", "zero1", "zero2")
"""The strategies whose gradients one collective per bucket reduces: where a scheme can replace it."""
WHY_NOT = {"zero3": "ZeRO-3 reduce-scatters per layer; its compressed reduction is ZeRO++'s qgZ (--zeropp qgz)",
           "single": "one rank reduces nothing", "ps": "a parameter server pushes and pulls, it does not all-reduce"}
STATEFUL_ON_ZERO2 = ("needs one reduction per step and keeps a full-size residual on every rank; ZeRO-2 "
                     "reduce-scatters every micro-batch to keep gradient shards only: use zero1 (which composes) or dp")

def refusal(scheme: str, strategy: str) -> str | None:
    """Why `scheme` cannot replace the gradient reduction of `strategy` ("dp", "zero1", "zero2",
    "zero3", "single" or "ps"); None when it can. `run.compress_options.check`
    and the planner give these reasons."""
    c = Compression(scheme)
    if c.on and strategy not in RUNS_WITH:
        return f"runs with strategy {', '.join(RUNS_WITH)}, not {strategy!r}: {WHY_NOT[strategy]}"
    return STATEFUL_ON_ZERO2 if c.stateful and strategy == "zero2" else None


def matrix(shape: Shape) -> tuple[int, int] | None:
    """A parameter as PowerSGD sees it: (shape[0], the rest flattened); None for a vector or scalar."""
    if len(shape) <= 1:
        return None
    return shape[0], math.prod(shape[1:])


def compresses(rows: int, cols: int, rank: int) -> bool:
    """torch's `_should_compress`: (n + m)·r·rate < n·m with r = min(n, m, R)."""
    r = min(rows, cols, rank)
    return (rows + cols) * r * MIN_COMPRESSION_RATE < rows * cols


def max_rank(matrices: list[tuple[int, int]]) -> int:
    """The largest R at which some (rows, cols) matrix still compresses (`compresses`: 2·(n + m)·R
    < n·m, R ≤ min(n, m)); 0 if none does."""
    return max([min(n, m, (n * m - 1) // (2 * (n + m))) for n, m in matrices] or [0])


def powersgd_split(shapes: list[Shape], rank: int) -> tuple[int, int, int]:
    """(P elements, Q elements, uncompressed elements) of one bucket's parameters."""
    p = q = plain = 0
    for s in shapes:
        mat = matrix(s)
        if mat is not None and compresses(*mat, rank):
            r = min(mat[0], mat[1], rank)
            p, q = p + mat[0] * r, q + mat[1] * r
        else:
            plain += math.prod(s)
    return p, q, plain


def largest_side_ok(shapes: list[Shape], rank: int) -> bool:
    """Whether `rank` is at most the smaller side of some matrix (else no R x R factor exists)."""
    return any(m is not None and rank <= min(m) for m in map(matrix, shapes))


def topk_k(numel: int, fraction: float) -> int:
    """Entries each rank keeps of a bucket of `numel`: ⌈f·numel⌉, at least 1."""
    return max(1, min(numel, math.ceil(fraction * numel))) if numel else 0


def pair_bytes(itemsize: int) -> int:
    """Bytes of one top-k (index, value) pair."""
    return INDEX_BYTES + itemsize


def bucket_calls(c: Compression, shapes: list[Shape], numel: int, padded: int, ranks: int, itemsize: int,
                 gradient: str) -> list[tuple[str, int, int]]:
    """(collective, elements, itemsize) one reduction of one bucket makes on `ranks` dp ranks:
    `gradient` is the strategy's own collective ("all_reduce" or "reduce_scatter", over `padded`
    elements); an all-gather's elements are its whole output (every rank's part)."""
    if not c.on or c.wire_itemsize:
        return [(gradient, numel if gradient == "all_reduce" else padded, c.wire_itemsize or itemsize)]
    if c.scheme == "powersgd":
        p, q, plain = powersgd_split(shapes, c.rank)
        return [("all_reduce", n, itemsize) for n in (plain, p, q) if n]
    return [("all_gather", ranks * topk_k(numel, c.fraction) * pair_bytes(itemsize), 1)]


def residual_itemsize(itemsize: int, fp16: bool) -> int:
    """A residual's element size: fp32 under fp16 gradients, else the gradients'. A residual holds
    loss-scaled gradients, and the scale doubles after a window of good steps: an fp16 residual
    entry above 65504/2 would become inf, and every later step would add it and be skipped."""
    return 4 if fp16 else itemsize


def state_bytes(c: Compression, buckets: list[list[Shape]], itemsize: int, fp16: bool = False) -> dict[str, int]:
    """Bytes the scheme keeps between steps on every rank: {"residual", "q"} for gradients of
    `itemsize` (`fp16`: of type fp16); padding excluded: the residual covers the parameters'."""
    if not c.stateful:
        return {"residual": 0, "q": 0}
    residual = sum(math.prod(s) for b in buckets for s in b) * residual_itemsize(itemsize, fp16)
    q = sum(powersgd_split(b, c.rank)[1] for b in buckets) * itemsize if c.scheme == "powersgd" else 0
    return {"residual": residual, "q": q}


def powersgd_flops(shapes: list[Shape], rank: int) -> float:
    """Multiply-adds x 2 of one PowerSGD reduction of a bucket: P = M·Q, Q = Mᵀ·P and the
    decompression P·Qᵀ (2·n·m·r each), and two Gram-Schmidt passes (≈ 2·(n + m)·r²)."""
    total = 0.0
    for s in shapes:
        mat = matrix(s)
        if mat is not None and compresses(*mat, rank):
            n, m = mat
            r = min(n, m, rank)
            total += 3 * 2 * n * m * r + 2 * (n + m) * r * r
    return total


def break_even_bandwidth(plain_bytes: float, compressed_bytes: float, extra_seconds: float) -> float | None:
    """The link bandwidth (bytes/s) below which compression pays: it saves (plain - compressed)
    bytes at 1/B seconds each and costs `extra_seconds` (its compute, plus the latency of the
    calls it adds, α-β: Hockney 1994), so it pays while (plain - compressed)/B > extra, i.e.
    B < (plain - compressed)/extra. None: it never pays (it saves no bytes); inf: always."""
    saved = plain_bytes - compressed_bytes
    if saved <= 0:
        return None
    return math.inf if extra_seconds <= 0 else saved / extra_seconds
