"""The planner's prediction for one training run, in the run's own terms (every number the planner
predicts has a measured twin in the engine's report).

`plan_inputs` turns a `TrainConfig` on `world` ranks into the planner's (ModelShape, Training,
Parallel); everything predicted below is `ringzero.plan` evaluated on them, with two facts of this
engine passed through: the dropout masks torch's CPU kernel keeps in the activations' dtype
(`mask_bytes`), and whether `sdpa` really runs the fused kernel (on CPU it falls back to the math
path, which stores the s x s weights, when dropout is on).

Traffic is predicted per bucket: the engine moves each flat bucket (padded to a multiple of the
ranks under ZeRO) as one collective, so the exact bytes are Σ over buckets of
`plan.comm_volume.volume` for the collective and algorithm that ran. The Φ-level figure of
`plan.strategy_comm` (one collective of the whole model) is the same up to the chunk rounding.
"""

from __future__ import annotations

from ..plan import activations as act
from ..plan import sharding
from ..plan.comm_volume import call_for, formula, volume
from ..plan.config import Parallel, Training
from ..plan.memory import model_states, state_bytes
from ..plan.shapes import ModelShape, param_count
from ..plan.sharding import Strategy
from .config import TrainConfig



def strategy(cfg: TrainConfig) -> Strategy:
    """The run's data-parallel strategy ("single" is DP on one rank)."""
    return sharding.DP if cfg.strategy == "single" else sharding.strategy(cfg.strategy)


def fused_attention(cfg: TrainConfig, cuda: bool = False) -> bool:
    """Whether `attention="sdpa"` keeps no s x s tensor (CPU: only without dropout)."""
    return cfg.attention == "sdpa" and (cuda or cfg.dropout == 0)


def plan_inputs(cfg: TrainConfig, world: int) -> tuple[ModelShape, Training, Parallel]:
    tr = Training(micro_batch=cfg.micro_batch, global_batch=cfg.global_batch(world),
                  precision=cfg.precision, optimizer="adam", dropout=cfg.dropout > 0)
    par = Parallel(dp=world, zero=strategy(cfg).zero, recompute=cfg.recompute,
                   flash_attention=fused_attention(cfg), bucket_mb=cfg.bucket_mb)
    return cfg.shape, tr, par


def activations(cfg: TrainConfig, cuda: bool = False) -> float:
    """Bytes saved for backward by one micro-batch's forward (all layers plus embedding and head)."""
    m, tr, par = plan_inputs(cfg, 1)
    p = tr.bytes_per_value
    mask = 1 if cuda else p
    per_layer = act.layer_bytes(m, cfg.micro_batch, m.seq, value_bytes=p, dropout=tr.dropout,
                                flash=fused_attention(cfg, cuda), recompute=cfg.recompute, mask_bytes=mask)
    return m.layers * per_layer + act.head_bytes(m, cfg.micro_batch, m.seq, value_bytes=p,
                                                 dropout=tr.dropout, mask_bytes=mask)


def states(cfg: TrainConfig, world: int) -> dict[str, float]:
    """Model-state bytes per rank from the ZeRO formulas (Rajbhandari et al. 2020)."""
    m, tr, par = plan_inputs(cfg, world)
    p, g, o, _ = model_states(param_count(m).total, state_bytes(tr.precision, tr.optimizer),
                              dp=par.dp, zero=par.zero)
    return {"params": p, "grads": g, "optimizer": o}


def _algorithm(cfg: TrainConfig, collective: str, n: int, nbytes: int) -> str:
    """The algorithm the engine's collective runs: the configured one mapped to `collective` as
    `ShardingConfig.algorithm_for` does, or what "auto" picks ("torch" stays "torch")."""
    from ..comm import select
    from ..comm.config import get_config
    from ..parallel.stages import ShardingConfig
    algo = ShardingConfig(algorithm=cfg.comm_algorithm).algorithm_for(collective)
    return select.choose(collective, n, nbytes, get_config().node_size(n)) if algo == "auto" else algo


def calls(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]]) -> list[tuple[str, int, int, int]]:
    """The collectives of one step: (collective, elements, itemsize, times) for `buckets` of
    (elements, is the ZeRO-3 root), from the strategy's schedule (`plan.sharding`)."""
    return strategy(cfg).calls(buckets, world, 4 if cfg.precision == "fp32" else 2, cfg.grad_accum)


def traffic(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rank: int = 0) -> dict[str, int]:
    """Bytes `rank` sends and receives in one step ("auto" resolved exactly as `ringzero.comm` does;
    "torch", the backend's own collective, as its ring twin `plan.comm_volume.BACKEND_TWIN`, which
    the traffic meter cannot see)."""
    from ..comm.config import get_config
    rpn = get_config().node_size(world)
    sent = recv = 0
    for collective, count, size, times in calls(cfg, world, buckets):
        algo = formula(collective, _algorithm(cfg, collective, world, count * size))
        v = volume(call_for(collective, algo, world, count, size, ranks_per_node=rpn), rank)
        sent += times * v.bytes_sent
        recv += times * v.bytes_recv
    return {"bytes_sent": sent, "bytes_recv": recv}


def comm_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]]) -> float:
    """Seconds of the step's collectives under this machine's calibrated α-β-γ model."""
    from ..comm import select
    from ..comm.config import get_config
    rpn = get_config().node_size(world)
    return sum(times * select.seconds(collective, _algorithm(cfg, collective, world, count * size), world,
                                      count * size, rpn)
               for collective, count, size, times in calls(cfg, world, buckets))


def optimizer_shard(cfg: TrainConfig, world: int) -> float:
    """Parameters in this rank's optimizer shard (the fused AdamW kernel runs over them once)."""
    return param_count(cfg.shape).total / (world if strategy(cfg).zero else 1)

