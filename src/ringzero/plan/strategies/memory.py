"""Memory per GPU: model states under DP, ZeRO-1/2/3, offload and TP/PP (Rajbhandari et al. 2020;
Ren et al. 2021; Rajbhandari et al. 2021), plus activations and communication buffers.

Bytes per parameter (ZeRO paper, Rajbhandari et al. 2020, §3.1):

    precision   weights  grads  Adam states                     SGD-momentum states
    bf16/fp16      2       2    12 = fp32 master + m + v        8 = fp32 master + momentum
    fp32           4       4     8 = m + v (weights are fp32)   4 = momentum

so mixed-precision Adam is the ZeRO paper's 16Ψ: 2Ψ + 2Ψ + 12Ψ. With Ψ' the parameters one
model-parallel rank holds (≈ Ψ/(tp·pp); exactly, its pipeline stage's blocks split over tp, the
replicated norms and biases, and the embedding on the first stage and the head on the last:
`pipeline_layout.stage_params`) and N_d = dp, ZeRO shards over the data-parallel group,
ceil(Ψ'/N_d) each (the padding to equal shards):

    stage 0   2Ψ' + 2Ψ' + 12Ψ'
    stage 1   2Ψ' + 2Ψ' + 12Ψ'/N_d
    stage 2   2Ψ' + (2 + 12)Ψ'/N_d
    stage 3   16Ψ'/N_d

Offload (ZeRO-Offload, Ren et al. 2021 / ZeRO-Infinity, Rajbhandari et al. 2021) moves the optimizer
states to CPU memory or NVMe: they leave the GPU total and appear as `offloaded`.

The busiest GPU is the pipeline stage whose model states and activations add up to the most (the
first stage holds the embedding and the most micro-batches in flight, but an uneven cut can give a
middle stage more blocks); both terms are that one stage's.

Buffers: DP and ZeRO-1/2 keep two gradient buckets (one filling while the other is reduced;
DDP's `bucket_cap_mb`, 25 MiB by default); ZeRO-3 holds the gathered weights of the current layer
and the `prefetch` layers gathered ahead of it (`zero3_layers_held`; FSDP's default of one layer in
flight is prefetch 1) plus the current layer's full gradient before its reduce-scatter; a pipeline stage holds one send and one receive activation buffer,
1/t of a micro-batch's activation per tensor-parallel rank (`pipeline.boundary_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ringzero.plan.model import activations as act
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.config import VALUE_BYTES, Parallel, Training, value_bytes
from ringzero.plan.pipeline.layout import chunk_layers, memory_candidates, stage_params
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.strategies.sharding import by_zero, shard_numel

MiB = 2**20


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state."""

    weights: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer


@lru_cache(maxsize=None)
def state_bytes(precision: str, optimizer: str) -> StateBytes:
    """The per-parameter bytes of the table above (cached: a handful of combinations)."""
    fp32 = VALUE_BYTES["fp32"]          # the moments, and the master copy of 16-bit weights
    mixed = precision != "fp32"
    moments = 2 if optimizer == "adam" else 1
    p = value_bytes(precision)
    return StateBytes(weights=p, grads=p, optimizer=fp32 * moments + (fp32 if mixed else 0))


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU (the busiest one), whole bytes: a fractional estimate is rounded up."""

    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    offloaded: int = 0
    """Optimizer bytes moved to CPU memory or NVMe (not in `total`)."""

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.buffers


def model_parallel_params(n_params: int, tp: int = 1, pp: int = 1) -> int:
    """Ψ' = ceil(Ψ / (tp·pp)): the parameters one model-parallel rank owns (an equal share)."""
    return math.ceil(n_params / (tp * pp))


def model_states(n_params: int, sb: StateBytes, dp: int = 1, zero: int = 0, tp: int = 1, pp: int = 1,
                 offload: str = "none") -> tuple[int, int, int, int]:
    """(params, grads, optimizer, offloaded) bytes per GPU for the ZeRO table above."""
    local = model_parallel_params(n_params, tp, pp)
    shard, s = shard_numel(local, dp), by_zero(zero)
    params = (shard if s.shard_params else local) * sb.weights
    grads = (shard if s.shard_grads else local) * sb.grads
    optimizer = (shard if s.shard_optimizer else local) * sb.optimizer
    if offload != "none":
        return params, grads, 0, optimizer
    return params, grads, optimizer, 0


def zero_formula(n_params: float, dp: int, stage: int, k: int = 12) -> float:
    """The ZeRO paper's closed forms with K = 12 (Figure 1): 2Ψ+2Ψ+KΨ/N, 2Ψ+(2+K)Ψ/N, (4+K)Ψ/N."""
    psi = n_params
    return {0: (4 + k) * psi, 1: 4 * psi + k * psi / dp, 2: 2 * psi + (2 + k) * psi / dp,
            3: (4 + k) * psi / dp}[stage]


def zero3_layers_held(prefetch: int, layers: int) -> int:
    """Layers ZeRO-3 holds gathered (or being gathered) at once, of `layers`: the one computing and
    the `prefetch` gathered ahead of it (`parallel.zero.zero3`'s hooks)."""
    return min(layers, 1 + prefetch)


def buffer_bytes(m: ModelShape, tr: Training, par: Parallel) -> int:
    """Communication buffers (see the module doc), rounded up to whole bytes."""
    sb = state_bytes(tr.precision, tr.optimizer)
    counts = param_count(m)
    layer = counts.per_layer / par.tp
    if by_zero(par.zero).shard_params:
        buffers = layer * (zero3_layers_held(par.prefetch, m.layers) * sb.weights + sb.grads)
    elif par.dp > 1:
        grads = model_parallel_params(counts.total, par.tp, par.pp) * sb.grads
        buffers = min(2 * par.bucket_mb * MiB, grads)
    else:
        buffers = 0.0
    if par.pp > 1:      # one micro-batch each way: one send and one receive buffer
        buffers += pipeline.boundary_bytes(1, tr.micro_batch, m.seq, m.hidden, tr.bytes_per_value, par.tp)
    return math.ceil(buffers)


@lru_cache(maxsize=65536)
def memory(m: ModelShape, tr: Training, par: Parallel) -> Memory:
    """Bytes per GPU on the busiest rank: model states, activations, buffers (the `Memory` fields),
    all of the pipeline stage that needs the most (`pipeline_layout.memory_candidates`). Cached: a
    search's winners are priced again by `estimate`, the recommendation and the comparisons."""
    sb = state_bytes(tr.precision, tr.optimizer)
    micro, buffers, v = tr.accumulation(par.dp), buffer_bytes(m, tr, par), par.virtual_stages
    busiest = None
    for stage in memory_candidates(m, par.pp, v):
        params, grads, optimizer, offloaded = model_states(
            stage_params(m, par.tp, stage, par.pp, v), sb, par.dp, par.zero, offload=par.offload)
        activations = _activations(m, tr.micro_batch, micro, tr.bytes_per_value, tr.dropout_for(m), par.pp,
                                   par.schedule, v, par.recompute, par.flash_attention, par.tp,
                                   par.sequence_parallel, stage)
        mem = Memory(params=params, grads=grads, optimizer=optimizer, activations=activations,
                     buffers=buffers, offloaded=offloaded)
        if busiest is None or mem.total > busiest.total:
            busiest = mem
    return busiest


@lru_cache(maxsize=65536)
def _activations(m: ModelShape, b: int, microbatches: int, value_bytes: int, dropout: bool, pp: int,
                 schedule: str, virtual_stages: int, recompute: str, flash: bool, tp: int, sp: bool,
                 stage: int = 0) -> int:
    """`memory`'s activations on pipeline stage `stage`: its chunks' blocks as the schedule holds
    them, and the output layer's with the last chunk, rounded up to whole bytes (cached: a search
    asks again for every ZeRO stage and offload, which do not change them)."""
    kw = dict(value_bytes=value_bytes, dropout=dropout, flash=flash, tp=tp, sp=sp)
    v = pipeline.effective_virtual_stages(schedule, virtual_stages)
    chunks = tuple(len(r) for r in chunk_layers(m, pp * v)) if pp > 1 else None
    head = act.head_bytes(m, b, m.seq, value_bytes=value_bytes, tp=tp)
    return math.ceil(act.activation_bytes(m, b, m.seq, pp=pp, microbatches=microbatches, schedule=schedule,
                                          virtual_stages=v, recompute=recompute, stage=stage, chunks=chunks,
                                          head=head, **kw))


def host_rank_bytes(states: float, activations: float, process: float) -> int:
    """Bytes one rank of a run on CPU ranks holds at its peak: the process itself (interpreter,
    framework, communication library), its model states, and the activations one micro-batch saves
    for backward, twice over (the saved tensors, and the gradients of the same size that backward
    creates while it consumes them)."""
    return math.ceil(process + states + 2 * activations)
