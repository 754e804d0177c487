"""Pipeline parallelism for any model whose forward runs its children in order (an `nn.Sequential`),
cut before the children named in `cut_at` (GPipe's partitioning of a sequence of layers, Huang et
al. 2019 §2): stage i keeps only its children, under their own names, and the last stage applies
`loss_fn(output, targets)`. Every stage's output must have the shape the schedule is given.

The same schedules run it (`train.pipeline_schedule.PipelineSchedule`); one chunk per stage (no
interleaving), no tied weights, no tensor parallelism.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ringzero.parallel.pp.boundary import StageBoundary


class SequentialStages(StageBoundary):
    """This rank's stage of `model` cut before each child named in `cut_at` (len(cut_at) + 1 stages)."""

    def __init__(self, model: nn.Sequential, topology, cut_at: list[str],
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        names = [n for n, _ in model.named_children()]
        if len(cut_at) != topology.pp - 1:
            raise ValueError(f"{len(cut_at)} cut points make {len(cut_at) + 1} stages, not pp={topology.pp}")
        unknown = [n for n in cut_at if n not in names]
        if unknown:
            raise ValueError(f"no child named {', '.join(map(repr, unknown))}; children: {', '.join(names)}")
        starts = [names.index(n) for n in cut_at]
        if starts != sorted(set(starts)) or starts[0] == 0:
            raise ValueError(f"cut points {cut_at} must be distinct children after the first, in model order")
        super().__init__(topology, scatter_gather=False)
        bounds = [0, *starts, len(names)]
        i = topology.pp_rank
        keep = set(names[bounds[i]:bounds[i + 1]])
        for n in names:
            if n not in keep:
                del model._modules[n]
        self.model, self.loss_fn = model, loss_fn
        self.chunks, self.last_chunk = [i], topology.pp - 1

    def forward(self, c: int, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        for child in self.model.children():
            x = child(x)
        if not self.is_last(c) or targets is None:
            return x
        return self.loss_fn(x, targets)

    def sync_tied_grads(self, strategy) -> None:
        """No weight is shared between stages."""
