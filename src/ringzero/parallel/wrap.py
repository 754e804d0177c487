"""One call that makes any `nn.Module` a training engine, as `deepspeed.initialize`, FSDP2's
`fully_shard` or torch.distributed.pipelining's `pipeline` + `ScheduleGPipe` do:

    engine = ringzero.parallel.wrap(model, strategy="zero2", optimizer=AdamConfig(lr=1e-3))
    for x, y in batches:
        engine.backward(loss_fn(engine(x), y))
        engine.step()

`strategy` is "dp", "zero1", "zero2" or "zero3" (`plan.strategies.sharding`); `tp_plan` splits the
model's linears over a tensor-parallel group first (`parallel.tp.tensor_parallel`'s module-name
patterns -> "colwise" / "rowwise"), the strategy then running over the dp group. That engine is
`parallel.wrap_engine.Engine`.

With `pp_split` the model (an `nn.Sequential`) is cut into pipeline stages instead, at the named
children or into a number of stages (`parallel.wrap_cut`), one stage per rank of each dp replica
(rank = stage · dp + dp rank, `plan.placement`), and run by `schedule` ("gpipe" or "1f1b") over
`microbatches`; the loss is `loss_fn(output, target)` on the last stage, so a step is one call:

    engine = wrap(model, strategy="dp", optimizer=AdamConfig(), pp_split=["4"], schedule="1f1b",
                  microbatches=4, loss_fn=nn.functional.mse_loss)
    for x, y in batches:
        engine.step(x, target=y)

That engine is `parallel.wrap_pipeline.PipelineEngine`. Both set the planner's numbers for the
model beside what they measured (`twins()`).
"""

from __future__ import annotations

from typing import Callable

import torch.distributed as dist
from torch import nn

from ringzero.parallel.optimizer import AdamConfig
from ringzero.parallel.replicas import broadcast_module
from ringzero.parallel.topology import Topology
from ringzero.parallel.tp.tensor_parallel import apply_tensor_parallel
from ringzero.parallel.wrap_cut import cut_names
from ringzero.parallel.wrap_engine import Engine, Pair
from ringzero.parallel.wrap_pipeline import PipelineEngine
from ringzero.plan.pipeline import schedule as schedules
from ringzero.plan.placement import Placement

__all__ = ["wrap", "Engine", "PipelineEngine", "Pair"]

PIPELINE_SCHEDULES = ("gpipe", "1f1b")
"""One model chunk per stage: the interleaved schedule needs virtual stages, which a cut of a
Sequential at named children does not make."""


def _topology(group, tp: int) -> Topology:
    if not dist.is_initialized():
        return Topology.alone()
    world = dist.get_world_size(group)
    if tp == 1:
        return Topology.data_parallel(group)
    if world % tp:
        raise ValueError(f"tp={tp} does not divide the {world} ranks")
    return Topology.build(Placement.for_world(world, tp=tp), group)


def _pipeline(model: nn.Module, pp_split, schedule: str, microbatches, loss_fn, strategy: str, group,
              grad_accum: int, tp: int) -> tuple[list[str], Topology]:
    """The cut points and the dp x pp grid, or one clear error."""
    if schedule not in PIPELINE_SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is not supported with pp_split; allowed: "
                         f"{', '.join(PIPELINE_SCHEDULES)}")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise ValueError(f"a pipeline needs microbatches, an integer >= 1, got {microbatches!r}")
    if not callable(loss_fn):
        raise ValueError("a pipeline needs loss_fn(output, target): its last stage computes the loss")
    if grad_accum != 1 or tp != 1:
        raise ValueError("with pp_split the micro-batches are the accumulation (microbatches, not grad_accum) "
                         "and tensor parallelism is not offered: pass grad_accum=1, tp=1")
    if strategy in ("zero2", "zero3"):
        raise ValueError(f"strategy {strategy!r} reduces during backward; a pipeline reduces after its "
                         "flush: ringzero takes dp or zero1 with pp_split")
    cut_at = cut_names(model, pp_split)
    stages = len(cut_at) + 1
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world % stages:
        raise ValueError(f"pp_split makes {stages} stages, which do not divide the {world} ranks "
                         f"(dp x pp must equal the ranks)")
    schedules.check(stages, len(model), microbatches, schedule)
    return cut_at, Topology.build(Placement.for_world(world, pp=stages), group)


def wrap(model: nn.Module, *, strategy: str = "dp", optimizer: AdamConfig | None = None, group=None,
         grad_accum: int = 1, bucket_mb: float = 25.0, algorithm: str = "auto", tp: int = 1,
         tp_plan: dict[str, str] | None = None, pp_split: list[str] | int | None = None,
         schedule: str = "1f1b", microbatches: int | None = None,
         loss_fn: Callable | None = None) -> Engine:
    """`model` as an `Engine` over the ranks of `group` (default: the whole job; one rank without a
    process group), every rank passing the same model, whose parameters and buffers start as the
    first rank's (`parallel.replicas`, as DDP); with `pp_split`, a `PipelineEngine` of this rank's
    stage (module doc)."""
    if optimizer is None or not isinstance(optimizer, AdamConfig):
        got = "nothing" if optimizer is None else type(optimizer).__name__
        raise TypeError(f"optimizer must be a ringzero.parallel.optimizer.AdamConfig (the engine's sharded AdamW "
                        f"updates each rank's shard), got {got}")
    if not isinstance(grad_accum, int) or isinstance(grad_accum, bool) or grad_accum < 1:
        raise ValueError(f"grad_accum must be an integer >= 1, got {grad_accum!r}")
    if (tp > 1) != (tp_plan is not None):
        raise ValueError("tp > 1 and tp_plan go together: the plan says which linears tp splits")
    broadcast_module(model, group)      # every rank starts from the first rank's weights and buffers
    if pp_split is not None:
        cut_at, topology = _pipeline(model, pp_split, schedule, microbatches, loss_fn, strategy, group,
                                     grad_accum, tp)
        return PipelineEngine(model, cut_at, schedule, microbatches, loss_fn, strategy, optimizer,
                              topology, bucket_mb, algorithm)
    topology = _topology(group, tp)
    if tp > 1:
        apply_tensor_parallel(model, topology, tp_plan, algorithm=algorithm)
    return Engine(model, strategy, optimizer, topology, grad_accum, bucket_mb, algorithm)
