"""Where `parallel.wrap.wrap(..., pp_split=...)` cuts an `nn.Sequential`, and the shapes that cross
each cut.

`pp_split` is either the names of the children where a new stage starts (torch.distributed.
pipelining's `split_spec` of `SplitPoint.BEGINNING`, over the top-level children: `"4"` in a plain
`nn.Sequential`, `"fc2"` in one built from an `OrderedDict`), or a number of stages, which cuts
the children into that many contiguous runs of least possible largest parameter count (the
planner's `plan.pipeline.schedule.partition`; a linear layer's FLOPs per token are twice its
parameters, Kaplan et al. 2020 §2.1, so parameters stand for the stage's compute).

The receiving stage must size its buffers before the message arrives, so every rank keeps storage-free
copies (device "meta") of the children up to the end of its stage and plays a micro-batch's shape
through them: the shapes a stage receives (its input, and its output's gradient) follow from the
micro-batch alone, with no message spent on them.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ringzero.plan.pipeline.schedule import partition


def cut_names(model: nn.Module, pp_split: list[str] | int) -> list[str]:
    """The child names where stages 1.. begin (a one-line ValueError for a split that is not one)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"pp_split cuts an nn.Sequential (its children run in order), got {type(model).__name__}")
    names = [n for n, _ in model.named_children()]
    if isinstance(pp_split, bool) or not isinstance(pp_split, (int, list, tuple)):
        raise ValueError(f"pp_split takes a list of child names or a number of stages, got {pp_split!r}")
    if isinstance(pp_split, int):
        if not 2 <= pp_split <= len(names):
            raise ValueError(f"pp_split={pp_split}: a pipeline needs 2 to {len(names)} stages "
                             f"(one child at least each) for this model's {len(names)} children")
        costs = [float(sum(p.numel() for p in c.parameters())) for c in model.children()]
        return [names[r.start] for r in partition(costs, pp_split)[1:]]
    if not pp_split:
        raise ValueError("pp_split=[] makes one stage: a pipeline needs at least one cut point")
    return [str(n) for n in pp_split]


def meta_children(model: nn.Sequential) -> tuple[list[str], list[nn.Module]]:
    """The children's names and storage-free copies of them (device "meta"), one copied at a time."""
    return [n for n, _ in model.named_children()], [copy.deepcopy(c).to("meta") for c in model.children()]


def check_stages_hold_weights(names: list[str], children: list[nn.Module], bounds: list[int]) -> None:
    """Every stage must train something: its optimizer updates its own weights (checked on every
    rank, on the copies, so that all of them raise)."""
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        if not any(p.requires_grad for c in children[a:b] for p in c.parameters()):
            raise ValueError(f"stage {i} ({', '.join(names[a:b])}) holds no trainable weight; move a cut point")


class BoundaryShapes:
    """Shapes and dtype of what enters and leaves one stage, for a given micro-batch shape."""

    def __init__(self, children: list[nn.Module], start: int) -> None:
        """`children`: the meta copies up to this stage's end; `start`: its first child."""
        self.children, self.start = children, start
        self._cache: dict[tuple, tuple] = {}

    def __call__(self, micro: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Meta tensors shaped as this stage's input and output for micro-batch `micro`."""
        key = (tuple(micro.shape), micro.dtype)
        if key not in self._cache:
            h = inp = torch.empty(micro.shape, dtype=micro.dtype, device="meta")
            try:
                with torch.no_grad():
                    for k, child in enumerate(self.children):
                        h = child(h)
                        if k == self.start - 1:
                            inp = h
            except Exception as e:   # an op with no meta kernel: say which, on one line
                first = str(e).splitlines()[0] if str(e) else ""
                raise ValueError(f"the shapes between stages could not be inferred on device 'meta' "
                                 f"({type(e).__name__}: {first})") from e
            self._cache[key] = (inp, h)
        return self._cache[key]
