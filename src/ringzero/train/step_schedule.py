"""The work of one training step as a schedule object, with measurement kept outside it.

A schedule runs the forward and backward passes of a step's micro-batches in its order; the trainer
then updates the weights. `GradAccumulation` is data and ZeRO parallelism's: one forward and one
backward per micro-batch, gradients accumulated, the strategy told which micro-batch is the last
(DDP's no_sync). Pipeline schedules (GPipe, 1F1B) interleave the micro-batches of several stages
instead and plug in here with the same `run` (the `StepSchedule` of `train.protocols`).

Measurement is in `StepHooks`: seconds per phase, and the bytes autograd saves during one forward
(the activation twin), so a schedule only says where its phases begin and end.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch
from torch import nn

from ringzero.comm import timeline
from ringzero.parallel.flat_strategy import FlatStrategy
from ringzero.parallel.recompute import SavedBytes


class StepHooks:
    """Seconds per phase of one step ("pipeline_wait": a pipeline stage waiting for its peers'
    messages); `saved_bytes` of the first forward when `measure` is set (a pipeline stage: the most
    it held at once)."""

    PHASES = ("forward", "backward", "comm", "optimizer", "pipeline_wait")

    def __init__(self, model: nn.Module | None, measure: bool = False) -> None:
        self.model, self.measure = model, measure
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self.saved_bytes: int | None = None

    @contextlib.contextmanager
    def phase(self, name: str, **args) -> Iterator[None]:
        """Time the block as phase `name` (on an open timeline: a span with `args`, e.g. the
        micro-batch; the seconds added are the span's own, so a trace sums to them exactly)."""
        with contextlib.ExitStack() as stack:
            for enter in timeline.AROUND:
                stack.enter_context(enter(name))
            t0 = time.time()
            try:
                with timeline.blocking() if name == "comm" else contextlib.nullcontext():
                    yield
            finally:
                t1 = time.time()
                self.seconds[name] += t1 - t0
                timeline.record(name, "phase", t0, t1, **args)

    @contextlib.contextmanager
    def forward(self, micro_batch: int) -> Iterator[None]:
        """The forward of `micro_batch`; the first one's saved activations are counted when measuring."""
        with self.phase("forward", micro=micro_batch):
            if self.measure and micro_batch == 0:
                with SavedBytes(self.model) as saved:
                    yield
                self.saved_bytes = saved.total
            else:
                yield


class GradAccumulation:
    """One forward and one backward per micro-batch, in order."""

    def run(self, model: nn.Module, strategy: FlatStrategy, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
            loss_scale: float, hooks: StepHooks) -> list[float]:
        """Losses of the micro-batches (x, y); gradients left reduced in `strategy`."""
        losses = []
        for k, (x, y) in enumerate(micro_batches):
            strategy.sync = k == len(micro_batches) - 1
            with hooks.forward(k):
                loss = model(x, y)
            with hooks.phase("backward", micro=k):
                (loss * loss_scale).backward()
            with hooks.phase("comm"):
                strategy.finish_backward()
            losses.append(loss.item())
        return losses
