"""When ZeRO-3 gathers which layer, and where it is in a micro-batch: the hooks of `zero3.ZeRO3`.

A layer is gathered before its forward, with the `depth` layers after it prefetched on the
communication thread, and released after it; gathered again before its backward, with the `depth`
layers before it prefetched, and released once its gradients are in (by ZeRO-3's gradient hook).
The root bucket (the parameters outside the layers) is gathered as the model's forward starts and
kept until its gradients are reduced. So at most 1 + depth layers are gathered at once
(`peak`, the twin of `plan.strategies.memory.zero3_layers_held`).

Where a micro-batch is, is ZeRO-3's own state, set by these hooks (FSDP2's `TrainingState`), not a
private attribute of autograd: a layer's forward run inside backward (recomputation) keeps its
weights for its backward and prefetches nothing.
"""

from __future__ import annotations

import enum
import functools

import torch
from torch import nn

from ringzero.parallel.comm_queue import CommQueue
from ringzero.parallel.flat_group import FlatGroup, Weights
from ringzero.parallel.zero.gather import AllGather
from ringzero.parallel.zero.shards import ShardStore
from ringzero.parallel.zero.zeropp import Policies
from ringzero.comm.kinds import kind, tagged
from ringzero.plan.strategies.sharding import ZERO3

_, BEFORE_FORWARD, BEFORE_BACKWARD = ZERO3.collectives
"""ZeRO-3's two weight gathers in the strategy table: each runs under its entry's kind, as the
planner prices it (ZeRO++'s replacements of them too)."""


class TrainingState(enum.Enum):
    """Where ZeRO-3 is in a micro-batch (FSDP2's `TrainingState`)."""

    IDLE = "idle"
    """Before the first forward, and after `finish_backward`."""
    FORWARD = "forward"
    """From the model's pre-forward hook."""
    BACKWARD = "backward"
    """From the first layer's pre-backward hook to `finish_backward`: a layer forward now is a
    recomputation, which must keep its weights for its backward and prefetch nothing."""


class LayerGathers:
    """The gathers of `order` (the layer buckets, forward order) and `root` over `queue`, from
    `shards` by `policies`, `depth` layers ahead; `exact` gathers without quantization."""

    def __init__(self, groups: list[FlatGroup], order: list[FlatGroup], root: FlatGroup | None, queue: CommQueue,
                 shards: ShardStore, policies: Policies, exact: AllGather, depth: int) -> None:
        self.groups, self.order, self.root, self.queue = groups, order, root, queue
        self.shards, self.policies, self.exact, self.depth = shards, policies, exact, depth
        self.state = TrainingState.IDLE
        self.peak = {TrainingState.FORWARD: 0, TrainingState.BACKWARD: 0}
        """The most layer buckets gathered or in flight at once, in forwards and in backwards."""
        chain = ([root] if root is not None else []) + order
        self._next = dict(zip(chain, chain[1:]))
        self._prev = {b: a for a, b in zip(order, order[1:])}
        self._at = {g: i for i, g in enumerate(order)}

    # -- the gathers ----------------------------------------------------------------------------
    def read_ahead(self, g: FlatGroup, backward: bool) -> FlatGroup | None:
        """The bucket whose read from an offloaded store `g`'s gather starts: the next one gathered.
        Forward: the next in forward order, or for the last layer (with gradients) itself, whose
        backward gather comes next; backward: the layer before. None where that gather reads
        no store (hpZ's backward reads its secondary copy) or nothing prefetches."""
        if not self.shards.reads_ahead or not self.depth:
            return None
        hpz = self.policies.secondary
        if backward:
            ahead = self._prev.get(g)
        elif self.order and g is self.order[-1] and torch.is_grad_enabled():
            ahead = g
        else:
            return self._next.get(g)
        return None if ahead is None or (hpz is not None and hpz.serves(ahead)) else ahead

    def gather_for(self, g: FlatGroup, backward: bool):
        """The function that gathers `g` before its forward or its backward, on the queue's thread,
        under the kind of that gather's table entry."""
        hpz = self.policies.secondary
        if backward and hpz is not None and hpz.serves(g):
            fn = hpz.gather
        else:
            fn = functools.partial(self._gather_weights, ahead=self.read_ahead(g, backward))
        return tagged((BEFORE_BACKWARD if backward else BEFORE_FORWARD).kind)(fn)

    def _gather_weights(self, g: FlatGroup, ahead: FlatGroup | None = None) -> torch.Tensor:
        with self.shards.loaded(g, ahead) as src:
            full = self.policies.gather.gather(g, src)
        if self.policies.secondary is not None:
            self.policies.secondary.keep(g, full)
        return full

    def exact_gather(self, g: FlatGroup) -> torch.Tensor:
        """The bucket's exact weights (never quantized), on the queue's thread."""
        with kind(BEFORE_FORWARD.kind), self.shards.loaded(g) as src:
            return self.exact.gather(g, src)

    def prefetch(self, g: FlatGroup | None, backward: bool) -> None:
        if g is not None and g.weights is Weights.SHARDED:
            g.gathering = self.queue.submit(self.gather_for(g, backward), g)
            g.weights = Weights.GATHERING

    def ensure(self, g: FlatGroup) -> None:
        if g.weights in (Weights.SHARDED, Weights.GATHERING):
            self.prefetch(g, self.state is TrainingState.BACKWARD)
            g.bind_gathered(g.gathering.result())
        self._note()

    def _ahead(self, g: FlatGroup, step: int) -> list[FlatGroup]:
        """The `depth` layers after `g` in the direction `step` (+1 forward, -1 backward)."""
        i, order = self._at[g], self.order
        return [order[j] for j in range(i + step, i + step * (self.depth + 1), step) if 0 <= j < len(order)]

    def _note(self) -> None:
        if self.state in self.peak:
            n = sum(g.weights is not Weights.SHARDED for g in self.order)
            self.peak[self.state] = max(self.peak[self.state], n)

    def _reset(self) -> None:
        # A new forward: nothing may be gathered or in flight from before (a forward that raised
        # midway, a layer that did not run): drop it, so no stale weights are used.
        for g in self.groups:
            if g.weights is not Weights.SHARDED:
                g.release()
        self.state = TrainingState.FORWARD
        self.shards.begin_forward()

    # -- the hooks ------------------------------------------------------------------------------
    def install(self, model: nn.Module, units: list[tuple[nn.Module, FlatGroup]]) -> None:
        """Hook `model` and each layer module of `units` (with its bucket)."""
        root = self.root

        def root_pre(module, args):
            self._reset()
            if root is not None:
                self.ensure(root)
            for g in self.order[:self.depth]:
                self.prefetch(g, backward=False)

        def root_post(module, args, out):
            if root is not None and not torch.is_grad_enabled():
                root.release()

        model.register_forward_pre_hook(root_pre)
        model.register_forward_hook(root_post)
        for unit, g in units:
            def pre(module, args, g=g):
                self.ensure(g)
                if self.state is TrainingState.FORWARD:     # a recomputed forward needs no next layer
                    for h in self._ahead(g, +1):
                        self.prefetch(h, backward=False)
                    self._note()

            def post(module, args, out, g=g):
                if self.state is TrainingState.FORWARD:     # a recomputed one keeps its weights for backward
                    g.release()

            def back_pre(module, grad_out, g=g):
                self.state = TrainingState.BACKWARD
                self.ensure(g)
                for h in self._ahead(g, -1):
                    self.prefetch(h, backward=True)
                self._note()

            unit.register_forward_pre_hook(pre)
            unit.register_forward_hook(post)
            unit.register_full_backward_pre_hook(back_pre)
