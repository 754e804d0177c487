"""ZeRO-3: weights sharded too, gathered a layer at a time (Rajbhandari et al. 2020 §5.3).

One bucket per layer (the children of every `nn.ModuleList`, e.g. transformer blocks) and one root
bucket for the rest (embeddings, final norm). A rank keeps only its weight shard. A layer is
all-gathered just before its forward (the next `prefetch` layers are gathered on the communication
thread while this one computes) and released after it, gathered again before its backward
(prefetching the layers before it), and its gradients are reduce-scattered once its backward is
done. The root is used at both ends of the model, so it is gathered once per micro-batch and kept
until its gradients are reduced. Nothing is gathered after the step: the optimizer updated the
shards themselves.

One class, three composed policies rather than subclasses (FSDP2 composes its param group the same
way): where the shards live between uses (`shards`: the device, or offloaded), how they are gathered
(`gather`: plain or qwZ, and hpZ's secondary copy for backward) and how gradients are reduced
(plain reduce-scatter or qgZ); `zeropp` builds the ZeRO++ ones.
"""

from __future__ import annotations

import enum
import functools

import torch
from torch import nn

from ringzero.parallel.flat_group import FlatGroup, Weights
from ringzero.parallel.offload.shards import OffloadedShards
from ringzero.parallel.zero.shards import DeviceShards, ShardStore
from ringzero.parallel.zero.zero12 import ZeRO2
from ringzero.parallel.zero.zeropp import policies
from ringzero.plan.strategies.sharding import ZERO3


class TrainingState(enum.Enum):
    """Where ZeRO-3 is in a micro-batch, set by its own hooks (FSDP2's `TrainingState`), so that a
    forward run again inside backward (recomputation) is told from a new forward."""

    IDLE = "idle"
    """Before the first forward, and after `finish_backward`."""
    FORWARD = "forward"
    """From the model's pre-forward hook."""
    BACKWARD = "backward"
    """From the first layer's pre-backward hook to `finish_backward`: a layer forward now is a
    recomputation, which must keep its weights for its backward and prefetch nothing."""


def _units(model: nn.Module) -> list[nn.Module]:
    """ZeRO-3's layers: the children of every ModuleList in `model`."""
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


class ZeRO3(ZeRO2):
    sharding = ZERO3

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for g in self.groups:
            g.keep_shard()
        self.state = TrainingState.IDLE
        offload = self.config.offload_params
        self.shards: ShardStore = (DeviceShards() if offload is None
                                   else OffloadedShards(self.groups, offload, self.queue))
        self.policies = policies(self.config.zeropp, self.groups, self.topology, self._algorithm)
        self.exact = policies(None, self.groups, self.topology, self._algorithm).gather
        self.order = [self.groups[bi] for _, bi in self._units]       # the layers, forward order
        chain = ([self._root] if self._root is not None else []) + self.order
        self._next = dict(zip(chain, chain[1:]))
        self._prev = {b: a for a, b in zip(self.order, self.order[1:])}
        self.peak_gathered = {TrainingState.FORWARD: 0, TrainingState.BACKWARD: 0}
        """The most layer buckets gathered or in flight at once, in forwards and in backwards
        (the planner's `plan.strategies.memory.zero3_layers_held` is its twin)."""
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
        qgz = self.policies.reduce
        if qgz is None:
            super()._reduce(g)
        else:
            g.add_reduced_shard(qgz.reduce_quantized(g.grad_flat).to(g.bucket.dtype))
            g.grad_flat = None
        if g.root:
            g.release()                # the root is used at both ends: kept until here

    def finish_backward(self) -> None:
        super().finish_backward()
        self.state = TrainingState.IDLE

    # -- weights --------------------------------------------------------------------------------
    def _read_ahead(self, g: FlatGroup, backward: bool) -> FlatGroup | None:
        """The bucket whose read from an offloaded store `g`'s gather starts: the next one gathered.
        Forward: the next in forward order, or for the last layer (with gradients) itself, whose
        backward gather comes next; backward: the layer before. None where that gather reads
        no store (hpZ's backward reads its secondary copy) or nothing prefetches."""
        if not self.shards.reads_ahead or not self.config.prefetch:
            return None
        hpz = self.policies.secondary
        if backward:
            ahead = self._prev.get(g)
        elif self.order and g is self.order[-1] and torch.is_grad_enabled():
            ahead = g
        else:
            return self._next.get(g)
        return None if ahead is None or (hpz is not None and hpz.serves(ahead)) else ahead

    def _gather_for(self, g: FlatGroup, backward: bool):
        """The function that gathers `g` before its forward or its backward, on the queue's thread."""
        hpz = self.policies.secondary
        if backward and hpz is not None and hpz.serves(g):
            return hpz.gather
        return functools.partial(self._gather_weights, ahead=self._read_ahead(g, backward))

    def _gather_weights(self, g: FlatGroup, ahead: FlatGroup | None = None) -> torch.Tensor:
        with self.shards.loaded(g, ahead) as src:
            full = self.policies.gather.gather(g, src)
        if self.policies.secondary is not None:
            self.policies.secondary.keep(g, full)
        return full

    def _gather(self, g: FlatGroup) -> torch.Tensor:
        """The bucket's exact weights (never quantized), for `full_params`."""
        with self.shards.loaded(g) as src:
            return self.exact.gather(g, src)

    def _prefetch(self, g: FlatGroup | None, backward: bool) -> None:
        if g is not None and g.weights is Weights.SHARDED:
            g.gathering = self.queue.submit(self._gather_for(g, backward), g)
            g.weights = Weights.GATHERING

    def _ensure(self, g: FlatGroup) -> None:
        if g.weights in (Weights.SHARDED, Weights.GATHERING):
            self._prefetch(g, self.state is TrainingState.BACKWARD)
            g.bind_gathered(g.gathering.result())
        self._note_gathered()

    def _note_gathered(self) -> None:
        if self.state in self.peak_gathered:
            n = sum(g.weights is not Weights.SHARDED for g in self.order)
            self.peak_gathered[self.state] = max(self.peak_gathered[self.state], n)

    def _reset(self) -> None:
        # A new forward: nothing may be gathered or in flight from before (a forward that raised
        # midway, a layer that did not run): drop it, so no stale weights are used.
        for g in self.groups:
            if g.weights is not Weights.SHARDED:
                g.release()
        self.state = TrainingState.FORWARD
        self.shards.begin_forward()

    def _install_hooks(self) -> None:
        order, depth, root = self.order, self.config.prefetch, self._root
        at = {g: i for i, g in enumerate(order)}

        def ahead(g: FlatGroup, step: int) -> list[FlatGroup]:
            """The `depth` layers after `g` in the direction `step` (+1 forward, -1 backward)."""
            i = at[g]
            return [order[j] for j in range(i + step, i + step * (depth + 1), step) if 0 <= j < len(order)]

        def root_pre(module, args):
            self._reset()
            if root is not None:
                self._ensure(root)
            for g in order[:depth]:
                self._prefetch(g, backward=False)

        def root_post(module, args, out):
            if root is not None and not torch.is_grad_enabled():
                root.release()

        self.model.register_forward_pre_hook(root_pre)
        self.model.register_forward_hook(root_post)
        for unit, bi in self._units:
            g = self.groups[bi]

            def pre(module, args, g=g):
                self._ensure(g)
                if self.state is TrainingState.FORWARD:     # a recomputed forward needs no next layer
                    for h in ahead(g, +1):
                        self._prefetch(h, backward=False)
                    self._note_gathered()

            def post(module, args, out, g=g):
                if self.state is TrainingState.FORWARD:     # a recomputed one keeps its weights for backward
                    g.release()

            def back_pre(module, grad_out, g=g):
                self.state = TrainingState.BACKWARD
                self._ensure(g)
                for h in ahead(g, -1):
                    self._prefetch(h, backward=True)
                self._note_gathered()

            unit.register_forward_pre_hook(pre)
            unit.register_forward_hook(post)
            unit.register_full_backward_pre_hook(back_pre)

    # -- the update and the store ---------------------------------------------------------------
    def before_step(self) -> None:
        self.shards.before_step()

    def after_step(self) -> None:
        super().after_step()
        self.shards.after_step()

    def shards_at_hand(self, changed: bool = False):
        return self.shards.shards_at_hand(changed)

    # -- accounting -----------------------------------------------------------------------------
    def held_bytes(self) -> dict[str, int]:
        """As ZeRO-2's, but "params" counts the storage the weight shards own now: every shard on
        the device; with the shards offloaded, none between steps and Σ shards around the update
        and from construction to the first forward. hpZ adds its "secondary" copies."""
        held = {**super().held_bytes(), "params": sum(g.shard.untyped_storage().nbytes() for g in self.groups)}
        if self.config.zeropp is not None:      # ZeRO++ reports its secondary bytes, 0 without hpZ
            hpz = self.policies.secondary
            held["secondary"] = hpz.held_bytes() if hpz is not None else 0
        return held

    def transient_bytes(self) -> int:
        """ZeRO-2's, plus the shards loaded from an offloaded store for gathers in flight."""
        return super().transient_bytes() + self.shards.loading_bytes()

    def offload_bytes(self) -> dict[str, int]:
        return self.shards.placement_bytes()

    def offload_io_bytes(self) -> dict[str, int]:
        return self.shards.io_bytes()

    def close(self) -> None:
        """Remove the store's swap file, then stop the communication thread (when ours)."""
        self.shards.close()
        super().close()
