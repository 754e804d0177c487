"""The plan's data-parallel gradient reduction compressed (`compression`): what it sends, costs and
saves, and where it pays, for `ringzero plan --compress`.

Tensors. A dp rank holds one tp rank's share of a pipeline stage (`rank_shapes`: the elements
`pipeline.layout.stage_params` counts): per block its norms, Q (h/t x h), K and V (kv·d/t x h,
grouped-query attention's narrower K/V), O (h x h/t), the MLP's up (and SwiGLU's gate) ffn/t x h and
down h x ffn/t, with their biases (Megatron-LM's split, Shoeybi et al. 2019 §3); the token embedding
V/t x h and learned positions s x h on the first stage, the final norm and the head (under a
pipeline, the tied embedding's copy) on the last. Vectors go in PowerSGD's plain all-reduce. The
stage with the most parameters is planned, in the engine's buckets (`parallel.flat_strategy`).

Wire. Each bucket's calls (`compression.bucket_calls`) are `CommOp`s on the plan's dp group priced
by `step_time.op_seconds` (α-β on the busiest rank, Hockney 1994); the same calls at unlimited
bandwidth leave their α terms (rounds·α), the latency, and compressed minus uncompressed latency
is what the calls a scheme adds cost.

Compute: a roofline (Williams et al. 2009), max(FLOPs / (matmul peak x gemm_efficiency), bytes
touched / (hbm_bw x memory_efficiency)) with `plan.hardware`'s constants and the bytes touched of
`CAST_BYTES`, `POWERSGD_PASSES`, `TOPK_PASSES`.

Where it pays: saved = uncompressed - compressed - compute seconds (the reduction's own, before any
overlap with backward); `compression.break_even_bandwidth` of the dp group's slowest link; and the
bucket size above which it pays on the plan's link.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ringzero.plan.config import Parallel
from ringzero.plan.estimate import Estimate
from ringzero.plan.hardware import Hardware
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.pipeline.layout import stage_layers, stage_params
from ringzero.plan.step_time import fastest_all_reduce, op_seconds
from ringzero.plan.strategies.compression import (SCHEMES, Compression, Shape, break_even_bandwidth, bucket_calls,
                                                  matrix, pair_bytes, powersgd_flops, refusal, state_bytes, topk_k)
from ringzero.plan.strategies.memory import model_parallel_params
from ringzero.plan.strategies.sharding import by_zero, padded_numel
from ringzero.plan.strategies.tensor_parallel import padded_vocab
from ringzero.plan.strategies.traffic import CommOp

CAST_BYTES = 2
"""fp16/bf16 (torch's `fp16_compress_hook`): read at the gradient's itemsize, written at 2 bytes, and
back after the reduction: 2·(itemsize + 2) bytes touched per element."""
POWERSGD_PASSES = 11
"""torch's `powerSGD_hook` (Vogels et al. 2019, Algorithm 1) over its bucket: the residual added (3),
the input kept (2), M read by P = M·Q and Q = Mᵀ·P (2), written by P·Qᵀ (1), the new residual (3).
Its rank-R matmuls do 2·R FLOPs per element read: memory-bound at small R (the roofline decides)."""
TOPK_PASSES = 10
"""top-k with error feedback (Stich et al. 2018) over its bucket: the residual added (3), the
magnitudes (2), torch.topk's radix select (2, a round figure), the residual kept (2), the output
zeroed (1); besides, the gathered (index, value) pairs are read and scattered."""


def _norm(m: ModelShape) -> list[Shape]:
    return [(m.hidden,)] * (2 if m.norm == "layernorm" else 1)


def block_shapes(m: ModelShape, tp: int = 1) -> list[Shape]:
    """One block's tensors on one of `tp` ranks, as torch's Linear stores them (out, in)."""
    h, kv, f = m.hidden, m.kv * m.head_dim // tp, m.ffn_dim // tp
    col = [(h // tp, h), (kv, h), (kv, h)]                  # Q, K, V: split by heads
    mlp_in = [(f, h)] * (2 if m.gated else 1)                # up (and gate)
    out = _norm(m) + col + ([(h // tp,), (kv,), (kv,)] if m.bias else []) + [(h, h // tp)]
    out += [(h,)] if m.bias else []                          # the row-parallel bias stays whole
    out += _norm(m) + mlp_in + ([(f,)] * len(mlp_in) if m.bias else []) + [(h, f)]
    return out + ([(h,)] if m.bias else [])


def rank_shapes(m: ModelShape, tp: int = 1, stage: int = 0, pp: int = 1, virtual_stages: int = 1) -> list[Shape]:
    """The tensors one tp rank of pipeline rank `stage` holds, in registration order."""
    embedding = (padded_vocab(m.vocab, tp) // tp, m.hidden)
    out: list[Shape] = []
    if stage == 0:
        out += [embedding] + ([(m.seq, m.hidden)] if m.positions == "learned" else [])
    out += block_shapes(m, tp) * stage_layers(m, stage, pp, virtual_stages)
    if stage == pp - 1:
        out += _norm(m) + ([embedding] if pp > 1 or not m.tied else [])
    return out


def busiest_stage(m: ModelShape, tp: int = 1, pp: int = 1, virtual_stages: int = 1) -> int:
    """The pipeline rank with the most parameters (the first of equals): the largest reduction."""
    return max(range(pp), key=lambda s: stage_params(m, tp, s, pp, virtual_stages))


def pack(shapes: list[Shape], itemsize: int, bucket_mb: float) -> list[list[Shape]]:
    """The engine's buckets: tensors in reverse order (as backward produces their gradients), a new
    bucket when the next tensor would take the current one past `bucket_mb` MiB."""
    limit, buckets, size = bucket_mb * 2**20, [[]], 0
    for s in reversed(shapes):
        n = math.prod(s) * itemsize
        if buckets[-1] and size + n > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(s)
        size += n
    return [b for b in buckets if b]


def gradient_calls(c: Compression, buckets: list[list[Shape]], zero: int, ranks: int, itemsize: int,
                   micro_batches: int) -> list[tuple[str, int, int, int]]:
    """(collective, elements, itemsize, calls per step) of the gradient reduction of ZeRO stage
    `zero` over `buckets` on `ranks` dp ranks, compressed by `c` (`compression.bucket_calls`)."""
    gradient = by_zero(zero).gradient
    times = gradient.times(micro_batches)
    out = []
    for shapes in buckets:
        numel = sum(math.prod(s) for s in shapes)
        out += [(*call, times) for call in bucket_calls(c, shapes, numel, padded_numel(numel, ranks), ranks,
                                                         itemsize, gradient.collective)]
    return out


def compute(c: Compression, buckets: list[list[Shape]], ranks: int, itemsize: int) -> tuple[float, float]:
    """(FLOPs, bytes touched) of compressing and decompressing one reduction of `buckets`."""
    flops = touched = 0.0
    for shapes in buckets:
        numel = sum(math.prod(s) for s in shapes)
        if c.wire_itemsize:
            touched += 2 * numel * (itemsize + CAST_BYTES)
        elif c.scheme == "powersgd":
            flops += powersgd_flops(shapes, c.rank)
            touched += POWERSGD_PASSES * numel * itemsize
        elif c.scheme == "topk":
            touched += TOPK_PASSES * numel * itemsize + 2 * ranks * topk_k(numel, c.fraction) * pair_bytes(itemsize)
    return flops, touched


@dataclass(frozen=True)
class Wire:
    """One step's gradient reduction as the busiest dp rank sees it (bytes it sends, seconds)."""

    calls: int
    bytes: float
    seconds: float
    rest_seconds: float
    """`seconds` with the dp group's slowest link unlimited: what its bandwidth does not set (α, NVLink legs)."""
    latency_seconds: float
    """`seconds` with every link unlimited: rounds·α."""
    link_bytes: float
    """The bytes crossing that link: the seconds its bandwidth sets, at its bandwidth."""

    @classmethod
    def of(cls, ops: list[CommOp], hw: Hardware, link: str) -> "Wire":
        def seconds(*unlimited: str) -> float:
            free = dataclasses.replace(hw, **{k: math.inf for k in unlimited})
            return sum(op_seconds(o, free) for o in ops)
        total, rest = seconds(), seconds(link)
        return cls(sum(o.calls for o in ops), sum(o.bytes_sent for o in ops), total, rest,
                   seconds("intra_bw", "inter_bw"), (total - rest) * getattr(hw, link))


@dataclass(frozen=True)
class CompressionPlan:
    """A dp rank's gradient reduction per step, uncompressed (`plain`) and compressed (`wire`)."""

    compression: Compression
    strategy: str
    ranks: int
    stage: int                     # the pipeline rank planned: the one with the most parameters
    link: str                      # "nvlink" or "network": the dp group's slowest link
    link_bw: float
    buckets: int
    reductions: int                # bucket reductions per step: buckets x the gradient's calls per step
    gradient_bytes: float
    plain: Wire
    wire: Wire
    compute_s: float
    flops: float
    touched_bytes: float
    state: dict[str, int]          # kept between steps: the residual and PowerSGD's Q (`state_bytes`)

    @property
    def ratio(self) -> float:
        return self.plain.bytes / self.wire.bytes if self.wire.bytes else math.inf

    @property
    def extra_latency_s(self) -> float:
        return self.wire.latency_seconds - self.plain.latency_seconds

    @property
    def saved_s(self) -> float:
        """Seconds per step it saves (negative: loses) on the plan's links."""
        return self.plain.seconds - self.wire.seconds - self.compute_s

    @property
    def break_even_bw(self) -> float | None:
        """`link` bytes/s below which it pays (None: never, inf: always): the bytes crossing it saved
        against the compute and the other seconds it adds."""
        return break_even_bandwidth(self.plain.link_bytes, self.wire.link_bytes,
                                    self.compute_s + self.wire.rest_seconds - self.plain.rest_seconds)

    @property
    def break_even_bucket_bytes(self) -> float | None:
        """Gradient bytes per bucket above which it pays here (inf: no size does; None: it adds no
        latency to repay): a bucket's saving but for its extra α grows with its bytes, the α does not."""
        extra = self.extra_latency_s / self.reductions
        per_byte = (self.saved_s + self.extra_latency_s) / self.gradient_bytes
        return None if extra <= 0 else extra / per_byte if per_byte > 0 else math.inf

    def to_dict(self) -> dict:
        """The JSON form (bytes, seconds, bytes/s; null for "never" and for an infinite figure)."""
        c, bw = self.compression, self.break_even_bw
        finite = (lambda v: v if v is not None and math.isfinite(v) else None)
        return {"scheme": c.scheme, "rank": c.rank if c.scheme == "powersgd" else None,
                "fraction": c.fraction if c.scheme == "topk" else None, "strategy": self.strategy,
                "ranks": self.ranks, "stage": self.stage, "link": self.link, "link_bandwidth": self.link_bw,
                "buckets": self.buckets, "gradient_bytes": self.gradient_bytes,
                "uncompressed": dataclasses.asdict(self.plain),
                "compressed": dataclasses.asdict(self.wire), "ratio": finite(self.ratio),
                "compute_seconds": self.compute_s, "compute_flops": self.flops, "compute_bytes": self.touched_bytes,
                "extra_latency_seconds": self.extra_latency_s, "saved_seconds": self.saved_s,
                "state_bytes": dict(self.state), "break_even_bandwidth": finite(bw),
                "pays": "never" if bw is None else "always" if math.isinf(bw) else "below break_even_bandwidth",
                "break_even_bucket_bytes": finite(self.break_even_bucket_bytes)}


def _strategy(scheme: str, par: Parallel) -> str:
    """The plan's data-parallel strategy, or a ValueError when `scheme` cannot compress its reduction."""
    strategy = "single" if par.dp == 1 else by_zero(par.zero).name
    why = refusal(scheme, strategy)
    if why:
        raise ValueError(f"compress={scheme} {why}")
    return strategy


def _ops(calls: list[tuple[str, int, int, int]], e: Estimate, node: int) -> list[CommOp]:
    """`calls` as CommOps on the plan's dp group. Every all-reduce runs the plan's gradient
    all-reduce algorithm (under ZeRO, which has none, "auto" resolved as the plan resolves DP's,
    for the whole gradient), so that the ratio compares the same collectives' bytes."""
    par = e.parallel
    own = [o.algorithm for o in e.ops if o.kind == "dp" and o.collective == "all_reduce"]
    algorithm = own[0] if own else par.dp_algorithm if par.dp_algorithm != "auto" else fastest_all_reduce(
        par.dp, model_parallel_params(e.params.total, par.tp, par.pp), e.training.bytes_per_value, node, e.hardware)
    return [CommOp("dp" if par.zero == 0 else "zero", "gradient", coll, algorithm if coll == "all_reduce" else "ring",
                   par.dp, count, size, times, node, "backward") for coll, count, size, times in calls]


def compression_plan(e: Estimate, c: Compression) -> CompressionPlan:
    """Plan `e`'s gradient reduction compressed by `c` (ValueError when its strategy cannot take it)."""
    m, tr, par, hw = e.model, e.training, e.parallel, e.hardware
    strategy = _strategy(c.scheme, par)
    stage = busiest_stage(m, par.tp, par.pp, par.virtual_stages)
    size, micro = tr.bytes_per_value, tr.accumulation(par.dp)
    buckets = pack(rank_shapes(m, par.tp, stage, par.pp, par.virtual_stages), size, par.bucket_mb)
    times = by_zero(par.zero).gradient.times(micro)
    node = par.placement(hw.gpus_per_node).node_size("dp")
    link = "inter_bw" if node < par.dp else "intra_bw"
    plain, wire = (Wire.of(_ops(gradient_calls(x, buckets, par.zero, par.dp, size, micro), e, node), hw, link)
                   for x in (Compression(), c))
    flops, touched = compute(c, buckets, par.dp, size)
    compute_s = times * max(flops / (hw.matmul_flops(tr.precision) * hw.gemm_efficiency),
                            touched / (hw.hbm_bw * hw.memory_efficiency))
    return CompressionPlan(
        compression=c, strategy=strategy, ranks=par.dp, stage=stage, link="network" if node < par.dp else "nvlink",
        link_bw=getattr(hw, link), buckets=len(buckets), reductions=len(buckets) * times,
        gradient_bytes=times * size * sum(math.prod(s) for b in buckets for s in b), plain=plain, wire=wire,
        compute_s=compute_s, flops=times * flops, touched_bytes=times * touched, state=state_bytes(c, buckets, size, tr.precision == "fp16"))


def compression_for(scheme: str, rank: int | None, fraction: float | None, m: ModelShape,
                    par: Parallel) -> Compression | None:
    """The scheme the plan's options ask for (None: none), or a one-line ValueError naming the option."""
    for name, value, owner, ok, allowed in (("powersgd_rank", rank, "powersgd", lambda v: v >= 1, "an integer >= 1"),
                                            ("topk_fraction", fraction, "topk", lambda v: 0 < v <= 1, "in (0, 1]")):
        if value is not None and scheme != owner:
            raise ValueError(f"{name} is {owner}'s option: it needs compress={owner}, not {scheme!r}")
        if value is not None and not ok(value):
            raise ValueError(f"{name}={value} must be {allowed}")
    if scheme not in SCHEMES:
        raise ValueError(f"compress={scheme!r} is not a scheme; allowed: {', '.join(SCHEMES)}")
    c = Compression(scheme, **{k: v for k, v in (("rank", rank), ("fraction", fraction)) if v is not None})
    _strategy(scheme, par)
    if c.scheme == "powersgd":
        stage = busiest_stage(m, par.tp, par.pp, par.virtual_stages)
        side = max(min(x) for x in map(matrix, rank_shapes(m, par.tp, stage, par.pp, par.virtual_stages)) if x)
        if c.rank > side:
            raise ValueError(f"powersgd_rank={c.rank} is larger than every matrix's smaller side (at most {side} "
                             f"in model {m.name!r} per tp rank); allowed 1..{side}")
    return c if c.on else None
