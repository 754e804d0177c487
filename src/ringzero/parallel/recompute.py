"""Activation recomputation (Chen et al. 2016; Korthikanti et al. 2022) and the
meter that counts the bytes saved for backward.

- "full": every layer (each child of an `nn.ModuleList`, e.g. a transformer block) runs under
  `torch.utils.checkpoint.checkpoint(use_reentrant=False)`: only its input is kept and the layer is
  re-run in backward, one extra forward (8·N·D FLOPs instead of 6·N·D).
- "selective": only the modules `targets` selects (the attention core: scores, softmax, dropout)
  run under checkpoint, so the large but cheap s x s tensors are recomputed from Q, K, V and
  everything else is kept (Korthikanti et al. §4.2). The engine passes its attention-core class, so
  this file knows no model.

`SavedBytes` measures what a forward keeps for backward: a `saved_tensors_hooks` pack hook adds up
the distinct storages autograd saves (parameters and buffers excluded: they are model states), and
a checkpointed region adds the storages of the inputs it holds for its re-run. Storages are counted
once however many views of them are saved.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ringzero.plan.config import RECOMPUTES as MODES
_METERS: list["SavedBytes"] = []


class SavedBytes:
    """Context manager: bytes of distinct storages saved for backward while it is open."""

    def __init__(self, model: nn.Module | None = None) -> None:
        self.exclude = set()
        if model is not None:
            self.exclude = {id(t) for t in list(model.parameters()) + list(model.buffers())}
            self.exclude |= {t.untyped_storage().data_ptr() for t in model.parameters() if t.numel()}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def note(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return
        if id(t) in self.exclude or (t._base is not None and id(t._base) in self.exclude):
            return                           # a weight, or a view of one (addmm saves weightᵀ)
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = storage.nbytes()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.note(t)
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def __enter__(self) -> "SavedBytes":
        _METERS.append(self)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        _METERS.remove(self)


class Checkpointed(nn.Module):
    """Runs `inner` under non-reentrant checkpoint; its inputs are what it keeps."""

    def __init__(self, inner: nn.Module, context_fn=None) -> None:
        super().__init__()
        self.inner, self.context_fn = inner, context_fn

    def forward(self, *args):
        if torch.is_grad_enabled():
            for meter in _METERS:
                for a in args:
                    meter.note(a)
        if self.context_fn is None:
            return checkpoint(self.inner, *args, use_reentrant=False)
        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self.context_fn)


def _wrap(parent: nn.Module, select, context_fn=None) -> int:
    wrapped = 0
    for name, child in list(parent.named_children()):
        if select(child):
            setattr(parent, name, Checkpointed(child, context_fn))
            wrapped += 1
        else:
            wrapped += _wrap(child, select, context_fn)
    return wrapped


def apply_recompute(model: nn.Module, mode: str, targets: tuple[type, ...] = (), context_fn=None) -> nn.Module:
    """Wrap `model`'s layers ("full") or its `targets` modules ("selective") in checkpoints, in place;
    `context_fn` as `torch.utils.checkpoint`'s (tensor parallelism's dropout RNG replays with it)."""
    if mode not in MODES:
        raise ValueError(f"recompute={mode!r}; allowed: {', '.join(MODES)}")
    if mode == "none":
        return model
    if mode == "full":
        for lst in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
            for i, layer in enumerate(lst):
                lst[i] = Checkpointed(layer, context_fn)
        return model
    if not targets or not _wrap(model, lambda m: isinstance(m, targets), context_fn):
        raise ValueError("selective recomputation needs the attention-core module type(s) to wrap; "
                         f"none of {[t.__name__ for t in targets]} is in the model")
    return model
