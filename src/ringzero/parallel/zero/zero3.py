"""ZeRO-3: weights sharded too, gathered a layer at a time (Rajbhandari et al. 2020 §5.3).

One bucket per layer (the children of every `nn.ModuleList`, e.g. transformer blocks) and one root
bucket for the rest (embeddings, final norm). A rank keeps only its weight shard. A layer is
all-gathered just before its forward (the next one is prefetched on the communication thread while
this one computes) and released after it, gathered again before its backward (prefetching the
previous layer), and its gradients are reduce-scattered once its backward is done. The root is used at
both ends of the model, so it is gathered once per micro-batch and kept until its gradients are
reduced. Nothing is gathered after the step: the optimizer updated the shards themselves.
"""

from __future__ import annotations

import torch
from torch import nn

from ringzero.plan.strategies.sharding import ZERO3
from ringzero.parallel.flat_group import FlatGroup, Weights
from ringzero.parallel.zero.zero12 import ZeRO2


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _units(model: nn.Module) -> list[nn.Module]:
    """ZeRO-3's layers: the children of every ModuleList in `model`."""
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


class ZeRO3(ZeRO2):
    sharding = ZERO3

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for g in self.groups:
            g.keep_shard()
        self._install_hooks()

    def _buckets(self) -> tuple[list[list[nn.Parameter]], int | None]:
        """One bucket per layer that has parameters, in model order, then the root (if any)."""
        seen: set[int] = set()
        self._units: list[tuple[nn.Module, int]] = []      # (layer, its bucket)
        groups = []
        for unit in _units(self.model):
            ps = [p for p in unit.parameters() if id(p) not in seen and p.requires_grad]
            seen.update(map(id, ps))
            if ps:
                self._units.append((unit, len(groups)))
                groups.append(ps)
        rest = [p for p in self.model.parameters() if id(p) not in seen and p.requires_grad]
        return groups + ([rest] if rest else []), (len(groups) if rest else None)

    @property
    def _root(self) -> FlatGroup | None:
        return next((g for g in self.groups if g.root), None)

    # -- gradients ------------------------------------------------------------------------------
    def _arrive(self, g: FlatGroup, i: int, p: nn.Parameter) -> None:
        # The root gets gradients at both ends of backward: its parameters keep their own .grad
        # until the last arrives and are copied into the flat then, so the whole root flat is not
        # held through backward (FSDP2 holds no more either).
        if not g.root:
            g.accumulate(i, p)

    def _bucket_done(self, g: FlatGroup) -> None:
        if g.root:
            for j, q in enumerate(g.params):
                g.accumulate(j, q)
        else:
            g.release()                # its backward is done: free the gathered layer now
        super()._bucket_done(g)

    def _reduce(self, g: FlatGroup) -> None:
        super()._reduce(g)
        if g.root:
            g.release()                # the root is used at both ends: kept until here

    # -- weights --------------------------------------------------------------------------------
    def _prefetch(self, g: FlatGroup | None) -> None:
        if g is not None and g.weights is Weights.SHARDED:
            g.gathering = self.queue.submit(self._gather_for(g, _in_backward()), g)
            g.weights = Weights.GATHERING

    def _gather_for(self, g: FlatGroup, backward: bool):
        """The function that gathers `g` before its forward or its backward (ZeRO++ tells them apart)."""
        return self._gather

    def _ensure(self, g: FlatGroup) -> None:
        if g.weights in (Weights.SHARDED, Weights.GATHERING):
            self._prefetch(g)
            g.bind_gathered(g.gathering.result())

    def _reset(self) -> None:
        # A new forward: nothing may be gathered or in flight from before (a forward that raised
        # midway, a layer that did not run): drop it, so no stale weights are used.
        for g in self.groups:
            if g.weights is not Weights.SHARDED:
                g.release()

    def _install_hooks(self) -> None:
        order = [self.groups[bi] for _, bi in self._units]
        nxt = dict(zip(order, order[1:]))
        prev = {b: a for a, b in zip(order, order[1:])}
        prefetch, root = self.config.prefetch, self._root

        def root_pre(module, args):
            self._reset()
            if root is not None:
                self._ensure(root)
            if order and prefetch:
                self._prefetch(order[0])

        def root_post(module, args, out):
            if root is not None and not torch.is_grad_enabled():
                root.release()

        self.model.register_forward_pre_hook(root_pre)
        self.model.register_forward_hook(root_post)
        for unit, bi in self._units:
            g = self.groups[bi]

            def pre(module, args, g=g):
                self._ensure(g)
                if prefetch and not _in_backward():     # a recomputed forward needs no next layer
                    self._prefetch(nxt.get(g))

            def post(module, args, out, g=g):
                if not _in_backward():       # a recomputed forward keeps its weights for backward
                    g.release()

            def back_pre(module, grad_out, g=g):
                self._ensure(g)
                if prefetch:
                    self._prefetch(prev.get(g))

            unit.register_forward_pre_hook(pre)
            unit.register_forward_hook(post)
            unit.register_full_backward_pre_hook(back_pre)
