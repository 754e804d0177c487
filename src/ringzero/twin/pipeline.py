"""The planner's prediction for one pipeline stage of a training run, in the run's own terms.

Every figure is read off the same schedule the engine runs (`plan.pipeline.schedule.actions`) and the same
cut (`plan.pipeline.layout`): which chunks a stage holds, how many micro-batches it holds at once,
what it sends over its boundaries, and which collectives only the first or last stage makes (the
tied embedding's gradient sum, the head's tensor-parallel collectives).
"""

from __future__ import annotations

from ringzero.plan.comm.kinds import EMBEDDING, TP, Call
from ringzero.plan.model import activations as act
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.strategies import tensor_parallel
from ringzero.plan.pipeline.layout import chunk_layers, stage_layers, stage_params
from ringzero.run.config import TrainConfig


def stage_of(cfg: TrainConfig, world: int, rank: int) -> int:
    return cfg.placement(world).coords(rank)["pp"]


def params(cfg: TrainConfig, stage: int) -> int:
    """Parameters one tp rank of `stage` holds."""
    return stage_params(cfg.shape, cfg.parallel.tp, stage, cfg.parallel.pp, cfg.parallel.virtual_stages)


def inflight(cfg: TrainConfig, stage: int) -> int:
    """Chunk micro-batches `stage` holds at its peak."""
    return pipeline.inflight(stage, cfg.parallel.pp, cfg.training.grad_accum, cfg.parallel.schedule, cfg.parallel.virtual_stages)


def chunk_activations(cfg: TrainConfig, per_layer: float, head: float) -> list[float]:
    """Bytes one micro-batch's forward saves in each global chunk: its blocks, plus the head and
    loss in the last (`per_layer`, `head`: `predict.activations`' terms)."""
    ranges = chunk_layers(cfg.shape, cfg.parallel.pp * cfg.parallel.virtual_stages)
    return [len(r) * per_layer + (head if g == len(ranges) - 1 else 0.0) for g, r in enumerate(ranges)]


def peak_activations(cfg: TrainConfig, stage: int, per_layer: float, head: float) -> float:
    """The most bytes of saved activations `stage` holds at once over its schedule."""
    return pipeline.held_at_peak(stage, cfg.parallel.pp, cfg.training.grad_accum, cfg.parallel.schedule, cfg.parallel.virtual_stages,
                                 chunk_activations(cfg, per_layer, head))


def boundary_numel(cfg: TrainConfig) -> int:
    """Elements a tp rank sends per message: (b, s, h)/t (scatter/gather, or sequence parallelism's shard)."""
    return pipeline.message_numel(cfg.training.micro_batch, cfg.shape.seq, cfg.shape.hidden, cfg.parallel.tp)


def boundary_bytes(cfg: TrainConfig) -> int:
    """Bytes over one stage boundary per step, both ways, per tp rank: 2·m·b·s·h·bytes / t."""
    m = cfg.shape
    return pipeline.boundary_bytes(cfg.training.grad_accum, cfg.training.micro_batch, m.seq, m.hidden, cfg.value_bytes, cfg.parallel.tp)


def _messages(cfg: TrainConfig, stage: int) -> dict[str, int]:
    return pipeline.messages(stage, cfg.parallel.pp, cfg.training.grad_accum, cfg.parallel.schedule, cfg.parallel.virtual_stages)


def p2p_traffic(cfg: TrainConfig, stage: int) -> dict[str, int]:
    """Bytes `stage` sends and receives point-to-point per step."""
    if cfg.parallel.pp == 1:
        return {"bytes_sent": 0, "bytes_recv": 0}
    n, size = _messages(cfg, stage), boundary_numel(cfg) * cfg.value_bytes
    return {"bytes_sent": (n["activations_sent"] + n["gradients_sent"]) * size,
            "bytes_recv": (n["activations_received"] + n["gradients_received"]) * size}


def tp_calls(cfg: TrainConfig, stage: int = 0) -> list[Call]:
    """`stage`'s tensor-parallel collectives of one step (each of kind "tp"):
    its blocks', the embedding's on the first stage, the head's and loss's on the last, and under
    scatter/gather an all-gather of each activation and gradient that arrives (without a pipeline:
    the whole model's; `plan.strategies.tensor_parallel.collectives`)."""
    first, last = stage == 0, stage == cfg.parallel.pp - 1
    layers = stage_layers(cfg.shape, stage, cfg.parallel.pp, cfg.parallel.virtual_stages)
    out = [Call(c, n, 4 if "fp32" in what else cfg.value_bytes, k * cfg.training.grad_accum, TP)
           for what, c, n, k in tensor_parallel.collectives(cfg.shape, cfg.training.micro_batch, cfg.parallel.tp,
                                                            sequence_parallel=cfg.parallel.sequence_parallel,
                                                            recompute=cfg.training.recompute, layers=layers,
                                                            first=first, last=last)]
    if not cfg.parallel.sequence_parallel:
        n = _messages(cfg, stage)
        arrivals = n["activations_received"] + n["gradients_received"]
        if arrivals:
            out.append(Call("all_gather", boundary_numel(cfg) * cfg.parallel.tp, cfg.value_bytes, arrivals, TP))
    return out


def embedding_calls(cfg: TrainConfig, stage: int) -> list[Call]:
    """The tied embedding's gradient sum between the first and last stage (one tp rank's slice)."""
    if cfg.parallel.pp == 1 or stage not in (0, cfg.parallel.pp - 1):
        return []
    m = cfg.shape
    return [Call("all_reduce", tensor_parallel.padded_vocab(m.vocab, cfg.parallel.tp) * m.hidden // cfg.parallel.tp,
                 cfg.value_bytes, 1, EMBEDDING)]


def fused_attention(cfg: TrainConfig, cuda: bool = False) -> bool:
    """Whether `attention="sdpa"` keeps no s x s tensor (CPU: only without dropout)."""
    return cfg.model.attention == "sdpa" and (cuda or cfg.model.dropout == 0)


def activation_terms(cfg: TrainConfig, cuda: bool = False) -> tuple[float, float]:
    """(bytes one block saves per micro-batch, bytes the embedding, head and loss save), as
    `predict.activations` counts them."""
    m, t, sp = cfg.shape, cfg.parallel.tp, cfg.parallel.sequence_parallel
    p = cfg.value_bytes
    mask, dropout = (1 if cuda else p), cfg.model.dropout > 0
    per_layer = act.layer_bytes(m, cfg.training.micro_batch, m.seq, value_bytes=p, dropout=dropout,
                                flash=fused_attention(cfg, cuda), recompute=cfg.training.recompute, mask_bytes=mask,
                                tp=t, sp=sp, sp_keeps_gathered=True)
    head = act.head_bytes(m, cfg.training.micro_batch, m.seq, value_bytes=p, tp=t, sp=sp, dropout=dropout,
                          mask_bytes=mask, vocab=tensor_parallel.padded_vocab(m.vocab, t))
    return per_layer, head


def bubble(cfg: TrainConfig) -> float:
    """The planner's idle fraction of a step: (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1)."""
    return pipeline.bubble_fraction(cfg.parallel.pp, cfg.training.grad_accum, cfg.parallel.schedule, cfg.parallel.virtual_stages)


def measured_bubble(timelines: list[list[list[tuple]]]) -> float | None:
    """The median over steps of the measured idle fraction; `timelines[stage][step]` holds that
    stage's (kind, micro, chunk, start, end) events (None: nothing recorded)."""
    import statistics
    steps = min((len(t) for t in timelines), default=0)
    if not steps:
        return None
    fractions = [pipeline.idle_fraction([[(e[:3], e[3], e[4]) for e in stage[k]] for stage in timelines])
                 for k in range(steps)]
    return statistics.median(fractions)
