"""`ringzero train --layout auto`: the layout `plan.search.recommend.engine_layout` picks for the model on
these ranks, and what it planned for (the planner's GPU, not this machine) and why."""

from __future__ import annotations

import dataclasses

from ringzero.run.config import TrainConfig


def _layout_inputs(cfg: TrainConfig, batch: int, keep_strategy: bool):
    """(Training, search space) of `--layout auto` for `cfg`'s model and a global batch of `batch`
    sequences (the ZeRO stage fixed to `cfg.parallel.strategy`'s when it was given)."""
    from ringzero.plan.config import Training
    from ringzero.plan.search.recommend import ENGINE_SPACE
    from ringzero.plan.strategies.sharding import strategy as sharding_strategy
    space = ENGINE_SPACE
    if keep_strategy:
        space = dataclasses.replace(space, zero=(sharding_strategy(cfg.parallel.strategy).zero,))
    tr = Training(micro_batch=cfg.training.micro_batch, global_batch=batch, precision=cfg.optim.precision, optimizer="adam",
                  dropout=cfg.model.dropout > 0)
    return tr, space


def auto_layout(cfg: TrainConfig, world: int, given: dict) -> TrainConfig:
    """`cfg` on the layout `plan.search.recommend.engine_layout` picks for its model on `world` ranks, with
    the global batch it would have under data parallelism alone (micro-batch x accumulation x world);
    a strategy given explicitly is kept."""
    from ringzero.plan.hardware import hardware
    from ringzero.plan.search.recommend import engine_layout
    from ringzero.commands.plan import DEFAULT_GPU
    for flag in ("tp", "dp", "pp", "schedule", "virtual_stages"):
        if flag in given:
            raise ValueError(f"--layout auto chooses --{flag.replace('_', '-')} itself; give one or the other")
    tr, space = _layout_inputs(cfg, cfg.training.micro_batch * cfg.training.grad_accum * world, "strategy" in given)
    par = engine_layout(cfg.shape, tr, world, hardware(DEFAULT_GPU), space=space)
    strategy = cfg.parallel.strategy if "strategy" in given else ("dp", "zero1", "zero2", "zero3")[par.zero]
    return dataclasses.replace(cfg, tp=par.tp, dp=par.dp, pp=par.pp, schedule=par.schedule,
                               virtual_stages=par.virtual_stages, strategy=strategy,
                               grad_accum=tr.accumulation(par.dp), sequence_parallel=par.sequence_parallel)


def layout_why(cfg: TrainConfig, world: int, kept_strategy: bool) -> str:
    """What `--layout auto` planned for (`auto_layout`'s result `cfg`): the hardware it priced (the
    planner's GPU, not these ranks), the chosen layout's predicted step there and the runner-up's
    (`plan.search.why`'s sentence)."""
    from ringzero.plan.hardware import hardware
    from ringzero.plan.search.recommend import engine_runs
    from ringzero.plan.search.space import search
    from ringzero.commands.plan import DEFAULT_GPU
    hw = hardware(DEFAULT_GPU)
    tr, space = _layout_inputs(cfg, cfg.training.micro_batch * cfg.training.grad_accum * cfg.placement(world).dp, kept_strategy)
    space = dataclasses.replace(space, micro_batches=(tr.micro_batch,), offload=("none",), max_tp=space.max_tp or world)
    found = search(cfg.shape, tr, hw, world, space=space, top=2, keep=lambda par: engine_runs(cfg.shape, par))
    text = (f"planned for {world} x {hw.name} (ringzero.plan's constants for that GPU, not this machine's "
            f"ranks, whose step time the run measures): predicted step {found.best[0].time.step * 1e3:.4g} ms there")
    if len(found.best) < 2:
        return text + "; no other layout fits or runs"
    why = next((w for w in found.why() if "runner-up" in w), "")
    return text + f", the runner-up's {found.best[1].time.step * 1e3:.4g} ms. {why}"
