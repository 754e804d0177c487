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
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            with timeline.blocking() if name == "comm" else contextlib.nullcontext():
                yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    @contextlib.contextmanager
    def forward(self, micro_batch: int) -> Iterator[None]:
        """The forward of `micro_batch`; the first one's saved activations are counted when measuring."""
        with self.phase("forward"):
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
            with hooks.phase("backward"):
                (loss * loss_scale).backward()
            with hooks.phase("comm"):
                strategy.finish_backward()
            losses.append(loss.item())
        return losses
