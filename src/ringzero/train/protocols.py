"""What the training loop's parts expect of each other, written down as Protocols.

- `StepSchedule`: the work of one step's micro-batches, handed the model, the sharding strategy,
  the micro-batches, the loss scale and `StepHooks` (`steps.forward_backward`). The two are
  `step_schedule.GradAccumulation` (data and ZeRO parallelism, and every parameter-server worker)
  and `pipeline_schedule.PipelineSchedule` (GPipe, 1F1B, interleaved 1F1B); a loop runs whichever
  its layout needs without asking which it has.
- `CheckpointedTrainer`: what `checkpointing` reads off a trainer to save its state and to load
  one back, in any layout; `engine.Trainer` is one. A parameter server's worker is not: the
  servers hold its state, and `ps_checkpoint` saves and resumes it from the worker's replica.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ringzero.parallel.flat_strategy import FlatStrategy
from ringzero.parallel.optimizer import ShardedAdam
from ringzero.parallel.precision import LossScaler, NoScaler
from ringzero.parallel.topology import Topology
from ringzero.parallel.tp.tensor_parallel import TPLayout
from ringzero.run.config import TrainConfig
from ringzero.train.step_schedule import StepHooks


@runtime_checkable
class StepSchedule(Protocol):
    """Runs the forward and backward passes of one step's micro-batches, in the schedule's order."""

    def run(self, model: nn.Module, strategy: FlatStrategy, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
            loss_scale: float, hooks: StepHooks) -> list[float]:
        """The losses of `micro_batches` (x, y) this rank computed (a pipeline: on its last stage,
        none elsewhere). Each loss is backpropagated times `loss_scale` (fp16's scaler, else 1);
        the gradients are left reduced in `strategy` for the optimizer. The phases are timed in
        `hooks`, and with `hooks.measure` the bytes saved for backward are counted there."""


@runtime_checkable
class CheckpointedTrainer(Protocol):
    """What `checkpointing` reads on a trainer (`save_checkpoint`, `load_checkpoint`,
    `init_weights`, `Saver`). Read-only here: plain attributes and properties both do. Besides
    these, `save_checkpoint` keeps its `Saver` on `trainer.saver`, making one when there is none."""

    @property
    def cfg(self) -> TrainConfig:
        """The run: where and when to save (`save_dir`, `save_every`, `keep`, `overwrite`,
        `async_save`, `offload_params`), `resume`, `steps`, and the layout's options the manifest
        records."""

    @property
    def topo(self) -> Topology:
        """This rank's place in the grid (world, rank, dp, tp, pp and its ranks in them) and
        `grid_group`, over which the run id is shared and a save's barrier waits."""

    @property
    def tp(self) -> TPLayout:
        """Tensor parallelism on this rank: its `rng` tracker's states are saved, and restored in
        the same layout."""

    @property
    def scaler(self) -> LossScaler | NoScaler:
        """fp16's loss scaler: its scale, good steps, skipped steps and tolerance are saved and
        restored (set in place)."""

    @property
    def opt(self) -> ShardedAdam:
        """The optimizer over the weights this rank owns: the fp32 master, Adam's moments and the
        step count `t` (set in place on load)."""

    @property
    def strategy(self) -> FlatStrategy:
        """The sharding: its buckets and owned weights are the pieces of the global tensors this
        rank writes and fills (`checkpoint.state.pieces`); `shards_at_hand` brings offloaded
        shards in and `after_step` rebuilds full weights from loaded shards."""
