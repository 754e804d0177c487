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
(plain reduce-scatter or qgZ); `zeropp` builds the ZeRO++ ones. When each layer is gathered, and
ZeRO-3's own training state, are `layer_gathers`'.
"""

from __future__ import annotations

import torch
from torch import nn

from ringzero.parallel.flat_group import FlatGroup
from ringzero.parallel.offload.shards import OffloadedShards
from ringzero.parallel.zero.layer_gathers import LayerGathers, TrainingState
from ringzero.parallel.zero.shards import DeviceShards, ShardStore
from ringzero.parallel.zero.zero12 import ZeRO2
from ringzero.parallel.zero.zeropp import policies
from ringzero.plan.strategies.sharding import ZERO3


def _units(model: nn.Module) -> list[nn.Module]:
    """ZeRO-3's layers: the children of every ModuleList in `model`."""
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


class ZeRO3(ZeRO2):
    sharding = ZERO3

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for g in self.groups:
            g.keep_shard()
        offload = self.config.offload_params
        self.shards: ShardStore = (DeviceShards() if offload is None
                                   else OffloadedShards(self.groups, offload, self.queue))
        self.policies = policies(self.config.zeropp, self.groups, self.topology, self._algorithm)
        exact = policies(None, self.groups, self.topology, self._algorithm).gather
        order = [self.groups[bi] for _, bi in self._units]       # the layers, forward order
        self.gathers = LayerGathers(self.groups, order, self._root, self.queue, self.shards, self.policies,
                                    exact, self.config.prefetch)
        self.gathers.install(self.model, [(unit, self.groups[bi]) for unit, bi in self._units])

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
        self.gathers.state = TrainingState.IDLE

    # -- weights --------------------------------------------------------------------------------
    @property
    def state(self) -> TrainingState:
        return self.gathers.state

    @property
    def peak_gathered(self) -> dict[TrainingState, int]:
        """The most layer buckets gathered or in flight at once, in forwards and in backwards
        (the planner's `plan.strategies.memory.zero3_layers_held` is its twin)."""
        return self.gathers.peak

    def _gather(self, g: FlatGroup) -> torch.Tensor:
        """The bucket's exact weights (never quantized), for `full_params`."""
        return self.gathers.exact_gather(g)

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
