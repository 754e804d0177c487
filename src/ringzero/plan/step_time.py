"""Time per optimizer step: compute, communication on the right link, overlap, bubble, offload.

- Compute (`plan.model.compute`): the busiest pipeline stage's blocks (and the output layer on the last,
  `plan.pipeline.layout`) for each of the rank's micro-batches, every matmul at the precision's peak
  and its shape's efficiency, the memory-bound work at HBM bandwidth; recomputation re-runs a
  forward (full) or the attention core (selective) in backward. The optimizer step streams the
  GPU's shard of the states once (on the host instead under offload).
- Communication: Hockney's α-β model (Hockney 1994, T = α + β·S) on each call's busiest rank:
  rounds·α + max(bytes sent, received)/bandwidth, with the exact rounds and bytes of
  `plan.comm.volume`. A group inside one node uses NVLink (intra_bw, intra_alpha); a group spanning
  nodes is as fast as its slowest link, the network, except the hierarchical all-reduces: Jia et
  al. 2018's node-local reduce and broadcast run on NVLink and its leaders' ring on the network;
  Mikami et al. 2018's (hierarchical_2d) node-local reduce-scatter and all-gather on NVLink and its
  per-local-index rings on the network, every GPU with its own NIC. `dp_algorithm="auto"` takes the all-reduce with the least time.
- Overlap: gradient collectives launched from backward hooks (DDP buckets, ZeRO-1/2 reduce-scatter,
  ZeRO-3's backward all-gather and reduce-scatter) hide behind the backward of the last
  micro-batch; ZeRO-3's forward all-gather behind forward (prefetch). At least the last bucket
  (or layer) is exposed. TP and PP communication sits on the critical path (Megatron-LM).
- Pipeline bubble (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2021 §2.2): a fraction
  f = (p-1)/(m+p-1) of the pipeline's time, (p-1)/(v·m+p-1) with the interleaved schedule's v
  chunks per rank (§2.2.2; `plan.pipeline.schedule.bubble_fraction`), so f/(1-f) x the compute time
  (`bubble_seconds`, which the engine's twin prices its bubble with too): (p-1)/m x it, or (p-1)/(v·m).
- Offload (ZeRO-Offload, Ren et al. 2021): gradients go down and weights come back over PCIe and
  the CPU runs the optimizer (`CPU_ADAM_PARAMS_PER_S`); with NVMe the optimizer states are also read
  and written at `nvme_bw`. All exposed: ringzero models no delayed parameter update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.model.compute import head_seconds, layer_seconds, optimizer_seconds
from ringzero.plan.comm.algorithms import NODE_AWARE, fits, names
from ringzero.plan.comm.volume import Volume
from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import Hardware
from ringzero.plan.strategies.memory import model_parallel_params, state_bytes
from ringzero.plan.pipeline.layout import stage_layers
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.strategies.sharding import by_zero, shard_numel
from ringzero.plan.strategies.traffic import (CommOp, data_parallel_ops, hierarchical_parts, pipeline_ops,
                            tensor_parallel_ops)

ALL_REDUCE_CHOICES = names("all_reduce")
"""What `dp_algorithm="auto"` weighs, in `plan.comm.algorithms` order (the first listed wins a tie)."""
CPU_ADAM_PARAMS_PER_S = 1e9
"""Parameters per second the host updates for one GPU's shard: an assumption of the order of
DeepSpeed's vectorised CPU-Adam on a many-core host (ZeRO-Offload, Ren et al. 2021, §5);
calibrate on your own host."""


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step on the busiest GPU."""

    forward: float
    backward: float
    comm: float
    """All communication, hidden or not."""
    exposed_comm: float
    """The part of `comm` not hidden behind compute."""
    bubble: float
    offload: float
    bubble_fraction: float
    comm_by_kind: dict[str, float] = field(default_factory=dict)
    optimizer: float = 0.0
    """The optimizer step on the GPU (0 when offloaded: `offload` holds the host's)."""

    @property
    def compute(self) -> float:
        return self.forward + self.backward

    @property
    def step(self) -> float:
        return self.compute + self.exposed_comm + self.bubble + self.offload + self.optimizer


def _tier_seconds(v: Volume, alpha: float, bw: float) -> float:
    return v.rounds * alpha + max(v.bytes_sent, v.bytes_recv) / bw


@lru_cache(maxsize=65536)
def _call_seconds(op: CommOp, hw: Hardware) -> float:
    if op.collective == "all_reduce" and op.algorithm in NODE_AWARE and op.spans_nodes:
        intra, inter = hierarchical_parts(op.algorithm, op.group, op.count, op.itemsize, op.node_size)
        return (_tier_seconds(intra, hw.intra_alpha, hw.intra_bw)
                + _tier_seconds(inter, hw.inter_alpha, hw.inter_bw))
    if op.spans_nodes:
        return _tier_seconds(op.volume(), hw.inter_alpha, hw.inter_bw)
    return _tier_seconds(op.volume(), hw.intra_alpha, hw.intra_bw)


@lru_cache(maxsize=4096)
def fastest_all_reduce(n: int, count: int, itemsize: int, node_size: int, hw: Hardware) -> str:
    """The all-reduce algorithm with the least modelled time for this buffer and group."""
    def seconds(algorithm: str) -> float:
        return _call_seconds(CommOp("dp", "", "all_reduce", algorithm, n, count, itemsize, 1,
                                    node_size, "backward"), hw)
    return min((a for a in ALL_REDUCE_CHOICES if fits(a, n, node_size)), key=seconds)


def op_seconds(op: CommOp, hw: Hardware) -> float:
    """Seconds `op` takes per step (all its calls)."""
    return op.calls * _call_seconds(op, hw)


def comm_ops(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> list[CommOp]:
    """Every collective of a step, with `dp_algorithm="auto"` resolved to the fastest all-reduce."""
    gpn = hw.gpus_per_node
    algo = par.dp_algorithm
    if algo == "auto":
        algo = "ring"
        if par.zero == 0 and par.dp > 1:
            (op,) = data_parallel_ops(m, tr, par, gpn, algo)
            algo = fastest_all_reduce(op.group, op.count, op.itemsize, op.node_size, hw)
    return (data_parallel_ops(m, tr, par, gpn, algo) + tensor_parallel_ops(m, tr, par, gpn)
            + pipeline_ops(m, tr, par, gpn))


def _exposed(total: float, hide: float, pieces: int) -> float:
    """Exposed seconds of `total` seconds of communication launched during `hide` seconds of
    compute: what does not fit, and at least the last of `pieces` pieces, which starts when the
    compute ends."""
    return max(total - hide, total / max(1, pieces)) if total else 0.0


def offload_seconds(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> float:
    """Host round trip of the optimizer step (see the module doc); 0 without offload."""
    if par.offload == "none":
        return 0.0
    sb = state_bytes(tr.precision, tr.optimizer)
    shard = shard_numel(model_parallel_params(param_count(m).total, par.tp, par.pp), par.dp)
    seconds = shard * (sb.grads + sb.weights) / hw.pcie_bw + shard / CPU_ADAM_PARAMS_PER_S
    if par.offload == "nvme":
        seconds += 2 * shard * sb.optimizer / hw.nvme_bw
    return seconds


@lru_cache(maxsize=65536)
def stage_seconds(m: ModelShape, b: int, tp: int, pp: int, virtual_stages: int, precision: str,
                  recompute: str, dropout: bool, sequence_parallel: bool, flash_attention: bool,
                  hw: Hardware) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch of `b` on the busiest pipeline stage: its
    blocks, and the output layer on the last stage (`plan.model.compute`)."""
    lf, lb = layer_seconds(m, b, tp, precision, recompute, dropout, sequence_parallel, flash_attention, hw)
    hf, hb = head_seconds(m, b, tp, precision, hw)
    stages = []
    for s in range(pp):
        n = stage_layers(m, s, pp, virtual_stages)
        last = s == pp - 1
        stages.append((n * lf + (hf if last else 0.0), n * lb + (hb if last else 0.0)))
    return max(stages, key=sum)


def compute_seconds(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> tuple[float, float]:
    """(forward, backward) seconds of a step's compute on the busiest GPU: `stage_seconds` for each
    of its data-parallel rank's micro-batches."""
    fwd, bwd = stage_seconds(m, tr.micro_batch, par.tp, par.pp, par.virtual_stages, tr.precision,
                             par.recompute, tr.dropout_for(m), par.sequence_parallel, par.flash_attention, hw)
    micro = tr.accumulation(par.dp)
    return micro * fwd, micro * bwd


def update_seconds(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> float:
    """The optimizer step on the GPU: its shard of the model-parallel slice (/dp under ZeRO);
    0 under offload, where the host runs it (`offload_seconds`)."""
    if par.offload != "none":
        return 0.0
    local = model_parallel_params(param_count(m).total, par.tp, par.pp)
    shard = shard_numel(local, par.dp) if by_zero(par.zero).shard_optimizer else local
    return optimizer_seconds(shard, tr.optimizer, hw)


def step_time(m: ModelShape, tr: Training, par: Parallel, hw: Hardware,
              ops: list[CommOp] | None = None) -> StepTime:
    """Seconds per step of configuration (`m`, `tr`, `par`) on `hw` (the module doc's model)."""
    micro = tr.accumulation(par.dp)
    forward, backward = compute_seconds(m, tr, par, hw)
    ops = comm_ops(m, tr, par, hw) if ops is None else ops
    by_kind, unhidden, during_forward, during_backward, dp_bytes = _comm_seconds(tuple(ops), hw)
    buckets = max(1, math.ceil(dp_bytes / (par.bucket_mb * 2**20)))
    layers = math.ceil(m.layers / par.pp)
    exposed = unhidden
    exposed += _exposed(during_forward, forward, layers)
    # DP and ZeRO-1 sync once, behind the last micro-batch's backward; ZeRO-2/3 every micro-batch.
    per_micro = by_zero(par.zero).reduces_every_micro_batch
    exposed += _exposed(during_backward, backward if per_micro else backward / micro,
                        layers if per_micro else buckets)
    fraction = pipeline.bubble_fraction(par.pp, micro, par.schedule, par.virtual_stages)
    return StepTime(forward=forward, backward=backward, comm=sum(by_kind.values()),
                    exposed_comm=exposed, bubble=pipeline.bubble_seconds(forward + backward, fraction),
                    offload=offload_seconds(m, tr, par, hw), bubble_fraction=fraction,
                    comm_by_kind=dict(by_kind), optimizer=update_seconds(m, tr, par, hw))


@lru_cache(maxsize=65536)
def _comm_seconds(ops: tuple[CommOp, ...], hw: Hardware) -> tuple[dict[str, float], float, float, float, int]:
    """`step_time`'s sums over `ops`: seconds by kind; seconds that nothing hides, launched during
    forward and during backward; bytes of the gradient buffer (cached: a search repeats the same
    collectives for every recomputation and schedule)."""
    timed = [(o, op_seconds(o, hw)) for o in ops]
    by_kind: dict[str, float] = {}
    for o, t in timed:
        by_kind[o.kind] = by_kind.get(o.kind, 0.0) + t
    return (by_kind, sum(t for o, t in timed if o.overlap == "none"),
            sum(t for o, t in timed if o.overlap == "forward"),
            sum(t for o, t in timed if o.overlap == "backward"),
            # the gradient buffer the buckets cut: DP's all-reduce or ZeRO's reduce-scatter
            sum(o.count * o.itemsize for o in ops
                if o.kind in ("dp", "zero") and o.collective in ("all_reduce", "reduce_scatter")))


def transfer_seconds(nbytes: float, bandwidth: float, alpha: float = 0.0) -> float:
    """One message: α + S/B (GPT-3's 350 GB of fp16 gradients: ≈ 7 s at 50 GB/s, ≈ 0.2 s at 1.8 TB/s)."""
    return alpha + nbytes / bandwidth
