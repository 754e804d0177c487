"""The planner's prediction for one training run, in the run's own terms (every number the planner
predicts has a measured twin in the engine's report).

`plan_inputs` turns a `TrainConfig` on `world` ranks into the planner's (ModelShape, Training,
Parallel); everything predicted below is `ringzero.plan` evaluated on them, with two facts of this
engine passed through: the dropout masks torch's CPU kernel keeps in the activations' dtype
(`mask_bytes`), and whether `sdpa` really runs the fused kernel (on CPU it falls back to the math
path, which stores the s x s weights, when dropout is on).

Traffic is predicted per bucket: the engine moves each flat bucket (padded to a multiple of the
ranks under ZeRO) as one collective, so the exact bytes are Σ over buckets of
`plan.comm.volume.volume` for the collective and algorithm that ran. The Φ-level figure of
`plan.strategies.traffic` (one collective of the whole model) is the same up to the chunk rounding.
"""

from __future__ import annotations

from ringzero.comm import select
from ringzero.comm.config import get_config
from ringzero.plan.comm.algorithms import for_collective
from ringzero.plan.comm.kinds import PP, SP, Call
from ringzero.plan.strategies import tensor_parallel
from ringzero.plan.strategies import zeropp
from ringzero.plan.comm.volume import Volume, call_for, formula, volume
from ringzero.plan.config import Parallel, Training
from ringzero.plan.strategies.memory import model_states, state_bytes
from ringzero.plan.strategies.sharding import NORM_CALL
from ringzero.plan.model.shapes import ModelShape
from ringzero.twin import pipeline as pipe
from ringzero.twin.pipeline import fused_attention
from ringzero.run import compress_options, zero_options
from ringzero.run.config import TrainConfig



def plan_inputs(cfg: TrainConfig, world: int) -> tuple[ModelShape, Training, Parallel]:
    """The planner's inputs for this run, with this engine's ways where the planner's default is
    Megatron-LM's: full recomputation through torch's non-reentrant checkpoint, which stops before
    a block's last tensor-parallel reduction (`plan.strategies.tensor_parallel.layer_collectives`)."""
    pl = cfg.placement(world)
    tr = Training(micro_batch=cfg.training.micro_batch, global_batch=cfg.global_batch(world),
                  precision=cfg.optim.precision, optimizer="adam", dropout=cfg.model.dropout > 0)
    par = Parallel(dp=pl.dp, tp=pl.tp, pp=pl.pp, sequence_parallel=cfg.parallel.sequence_parallel, zero=cfg.sharding.zero,
                   recompute=cfg.training.recompute, recompute_replay="early-stop", flash_attention=fused_attention(cfg),
                   bucket_mb=cfg.parallel.bucket_mb, schedule=cfg.parallel.schedule, virtual_stages=cfg.parallel.virtual_stages,
                   offload=cfg.zero.offload_optimizer, prefetch=cfg.zero.prefetch)
    return cfg.shape, tr, par


def activations(cfg: TrainConfig, cuda: bool = False, stage: int | None = None) -> float:
    """Bytes one rank saves for backward in one micro-batch's forward (all layers plus embedding and
    head; 1/t of the split tensors under tensor parallelism); with `stage` under a pipeline, the most
    that stage holds at once over its schedule."""
    per_layer, head = pipe.activation_terms(cfg, cuda)
    if stage is not None and cfg.parallel.pp > 1:
        return pipe.peak_activations(cfg, stage, per_layer, head)
    return cfg.shape.layers * per_layer + head


def states(cfg: TrainConfig, world: int, rank: int = 0) -> dict[str, float]:
    """Model-state bytes of `rank` from the ZeRO formulas (Rajbhandari et al. 2020), over the
    parameters its pipeline stage holds."""
    m, tr, par = plan_inputs(cfg, world)
    p, g, o, _ = model_states(local_params(cfg, world, rank), state_bytes(tr.precision, tr.optimizer),
                              dp=par.dp, zero=par.zero, offload=cfg.zero.offload_optimizer)
    if cfg.zero.offload_params != "none":          # ZeRO-3's shards live in the parameter store between steps
        p = 0
    return {"params": p, "grads": g, "optimizer": o}


def local_params(cfg: TrainConfig, world: int, rank: int = 0) -> int:
    """Parameters `rank` holds before any ZeRO sharding: its tp share of its pipeline stage's."""
    return pipe.params(cfg, pipe.stage_of(cfg, world, rank))


def calls(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]]) -> list[Call]:
    """The data-parallel collectives of one step on `world` ranks for `buckets` of (elements, is
    the ZeRO-3 root, shapes), from the strategy's schedule
    (`plan.strategies.sharding`), on the dp group; with gradient compression, the measured step's
    (the run measures a compressed step: `train.steps.StepSpan`)."""
    return cfg.sharding.calls(buckets, cfg.placement(world).dp, cfg.value_bytes, cfg.training.grad_accum,
                              compress_options.compression(cfg))


def tp_calls(cfg: TrainConfig, stage: int = 0) -> list[Call]:
    """The tensor-parallel collectives of one step inside forward and backward, on the tp group
    (a pipeline stage's: its blocks, and the embedding's or head's where it holds them)."""
    return pipe.tp_calls(cfg, stage) if cfg.parallel.tp > 1 else []


def tp_step_calls(cfg: TrainConfig, world: int, sp_elements: int | None = None) -> list[Call]:
    """The tensor-parallel collectives after backward: the sequence-parallel gradient sum over what
    this rank owns of the LayerNorm and bias gradients (`sp_elements`, from the bucket layout as
    `TensorParallelGrads.partial_elements`; None: 1/dp of them under ZeRO, all otherwise) and the
    norm's sum."""
    if cfg.parallel.tp == 1:
        return []
    out = []
    if cfg.parallel.sequence_parallel:
        share = cfg.placement(world).dp if cfg.sharding.shard_optimizer else 1
        n = tensor_parallel.partial_grad_params(cfg.shape) // share if sp_elements is None else sp_elements
        out += [Call("all_reduce", n, cfg.value_bytes, 1, SP)] if n else []
    return out + [NORM_CALL]


GROUP_DIM = {"dp": "dp", "tp": "tp", "tp_step": "tp", "pp_step": "pp", "dp_node": "dp", "dp_cross": "dp"}
DP_GROUPS = ("dp", "dp_node", "dp_cross")
"""The dp group and ZeRO++'s blocks of it: their collectives run the strategy's algorithms."""
"""The grid dimension of each group of `grouped_calls` ("embedding": the first and last stage)."""


def grouped_calls(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]],
                  sp_elements: int | None = None, rank: int = 0) -> list[tuple[str, int, list]]:
    """(group, its ranks, `rank`'s calls of one step on it): the dp group's, the tp group's inside
    forward and backward ("tp") and after it ("tp_step"), and under a pipeline the tied embedding's
    gradient sum ("embedding") and the norm's sum over the stages ("pp_step")."""
    pl = cfg.placement(world)
    stage = pl.coords(rank)["pp"]
    out = zeropp_calls(cfg, world, buckets) if cfg.zero.zeropp else [("dp", pl.dp, calls(cfg, world, buckets))]
    out += [("tp", pl.tp, tp_calls(cfg, stage)),
           ("tp_step", pl.tp, tp_step_calls(cfg, world, sp_elements))]
    if pl.pp > 1:
        out += [("embedding", 2, pipe.embedding_calls(cfg, stage)), ("pp_step", pl.pp, [NORM_CALL])]
    return out


def zeropp_calls(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]]) -> list[tuple[str, int, list]]:
    """ZeRO++'s (group, its ranks, calls of one step) on the dp group and its node blocks (`plan.strategies.zeropp`)."""
    zpp, dp = zero_options.zeropp(cfg, world), cfg.placement(world).dp
    every = zeropp.calls(zpp, buckets, dp, cfg.value_bytes, cfg.training.grad_accum)
    sizes = {"dp": dp, "dp_node": zpp.partition, "dp_cross": zpp.blocks(dp)}
    return [(g, n, [c for group, c in every if group == g]) for g, n in sizes.items()]


def _index(cfg: TrainConfig, world: int, group: str, rank: int) -> int:
    at = cfg.placement(world).coords(rank)
    if group == "embedding":
        return 0 if at["pp"] == 0 else 1
    if group in DP_GROUPS:
        return zeropp.group_index(zero_options.zeropp(cfg, world) or zeropp.ZeroPP(), group, at["dp"])
    return at[GROUP_DIM[group]]


def node_size(cfg: TrainConfig, n: int) -> int:
    """Ranks per node in a group of `n` as the run's collectives see it: the run's `ranks_per_node`
    (its ranks run under `comm.configure(ranks_per_node=...)`), else the comm config's."""
    return max(1, min(cfg.parallel.ranks_per_node, n)) if cfg.parallel.ranks_per_node else get_config().node_size(n)


def algorithm(cfg: TrainConfig, group: str, collective: str, n: int, nbytes: int) -> str:
    """The algorithm a collective runs: the configured one mapped to `collective` as
    `ShardingConfig.algorithm_for` does (the tp groups': `TrainConfig.tp_algorithm`), or what "auto"
    picks ("torch" stays "torch")."""
    algo = for_collective(cfg.parallel.comm_algorithm, collective) if group in DP_GROUPS else cfg.parallel.tp_algorithm
    return select.choose(collective, n, nbytes, node_size(cfg, n), transport_of(cfg)) if algo == "auto" else algo


def transport_of(cfg: TrainConfig) -> str:
    """What the run's messages between local ranks take (`comm.transport`): gloo's point-to-point
    only when asked for, shared memory otherwise, as `auto` resolves for ranks on one host."""
    return "gloo" if cfg.parallel.transport == "gloo" else "shm"


def traffic_by_kind(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rank: int = 0,
                    sp_elements: int | None = None) -> dict[str, Volume]:
    """`rank`'s traffic of one step by communication kind (each call's own, `plan.comm.kinds`; a
    pipeline stage's point-to-point messages "pp"), each call's bytes as `traffic` prices them;
    kinds with no call are left out."""
    p2p = pipe.p2p_traffic(cfg, cfg.placement(world).coords(rank)["pp"])
    out = {PP: Volume(**p2p)} if cfg.parallel.pp > 1 else {}
    for group, n, group_calls in grouped_calls(cfg, world, buckets, sp_elements, rank):
        rpn, r = node_size(cfg, n), _index(cfg, world, group, rank)
        for c in group_calls:
            algo = formula(c.collective, algorithm(cfg, group, c.collective, n, c.count * c.itemsize))
            out[c.kind] = out.get(c.kind, Volume()) + c.times * volume(
                call_for(c.collective, algo, n, c.count, c.itemsize, ranks_per_node=rpn), r)
    return out


def traffic(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rank: int = 0,
            sp_elements: int | None = None) -> dict[str, int]:
    """Bytes `rank` sends and receives in one step ("auto" resolved exactly as `ringzero.comm` does;
    "torch", the backend's own collective, as its ring twin `plan.comm.volume.BACKEND_TWIN`, which
    the traffic meter cannot see): every group's collectives (`grouped_calls`) and a pipeline
    stage's point-to-point messages, the sum of `traffic_by_kind`."""
    total = sum(traffic_by_kind(cfg, world, buckets, rank, sp_elements).values(), Volume())
    return {"bytes_sent": total.bytes_sent, "bytes_recv": total.bytes_recv}


def comm_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]],
                 sp_elements: int | None = None, rank: int = 0) -> float:
    """Seconds of the step's collectives under this machine's calibrated α-β-γ model."""
    return sum(call_seconds(cfg, group, c.collective, n, c.count * c.itemsize) * c.times
               for group, n, group_calls in grouped_calls(cfg, world, buckets, sp_elements, rank)
               for c in group_calls)


def call_seconds(cfg: TrainConfig, group: str, collective: str, n: int, nbytes: int) -> float:
    """One call's seconds under the calibrated α-β-γ model."""
    return select.seconds(collective, algorithm(cfg, group, collective, n, nbytes), n, nbytes,
                          node_size(cfg, n), transport_of(cfg))


def optimizer_shard(cfg: TrainConfig, world: int, rank: int = 0) -> float:
    """Parameters in `rank`'s optimizer shard (the fused AdamW kernel runs over them once)."""
    dp = cfg.placement(world).dp
    return local_params(cfg, world, rank) / (dp if cfg.sharding.shard_optimizer else 1)

