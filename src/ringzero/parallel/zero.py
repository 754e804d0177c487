"""Data parallelism and ZeRO-1/2/3 over flat buckets (Li et al. 2020; Rajbhandari et al. 2020).

`apply_sharding(model, topology, config)` lays the parameters out in `FlatBucket`s and hooks the
model so that, per `config.stage`:

- DP: every rank keeps the whole model; each bucket's gradients are all-reduced from a
  post-accumulate-grad hook as soon as the bucket is complete, so communication overlaps backward
  (DDP's design, Li et al. 2020). Buckets follow reverse registration order, roughly the order
  backward produces gradients.
- ZeRO-1: gradients as DP, but each bucket is reduce-scattered, and the optimizer updates only
  this rank's shard; `step` then all-gathers the weights.
- ZeRO-2: the bucket's reduce-scatter runs after every micro-batch and the full gradient is freed,
  so a rank holds gradient shards only.
- ZeRO-3: one bucket per layer (the children of each `nn.ModuleList`, e.g. transformer blocks) and
  one root bucket for the rest; a rank keeps only its weight shard. A layer is all-gathered just
  before its forward (the next one is prefetched) and freed after it, gathered again before its
  backward, and its gradients are reduce-scattered when complete; no all-gather after the step.

DP and ZeRO-1 communicate only on the last micro-batch of a step (`sync=False` before the others).
Gradients are summed; the optimizer divides by ranks x micro-batches. All collectives run in
issue order on one `CommQueue` thread.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import comm
from .comm_queue import CommQueue
from .flat import FlatBucket
from .stages import ShardingConfig
from .topology import Topology


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _units(model: nn.Module) -> list[nn.Module]:
    """ZeRO-3's layers: the children of every ModuleList in `model`."""
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


class Sharded:
    """`model` with its parameters in flat buckets and the hooks of `config.stage` installed."""

    def __init__(self, model: nn.Module, topology: Topology, config: ShardingConfig) -> None:
        self.model, self.topology, self.config, self.stage = model, topology, config, config.stage
        self.group = topology.group
        self.queue = CommQueue()
        self.sync = True
        self.root: int | None = None
        shards, index = (topology.dp, topology.dp_rank) if self.stage.shard_optimizer else (1, 0)
        groups = self._unit_params() if self.stage.shard_params else self._size_params()
        self.buckets = [FlatBucket(ps, shards, index) for ps in groups]
        self.param_flats: list[torch.Tensor | None] = [b.gather_params() for b in self.buckets]
        self.grad_flats: list[torch.Tensor | None] = [None] * len(self.buckets)
        self.grad_shards: list[torch.Tensor | None] = [None] * len(self.buckets)
        self._ready = [0] * len(self.buckets)
        self._got: set[tuple[int, int]] = set()    # (bucket, slot) that received a gradient
        self._gathering: dict[int, object] = {}   # bucket -> future of its all-gather
        self.landing: dict[int, torch.Tensor] = {}  # bucket -> all-gather output allocated, not bound yet
        for bi, b in enumerate(self.buckets):
            for i, p in enumerate(b.params):
                p.register_post_accumulate_grad_hook(self._grad_hook(bi, i))
        if self.stage.shard_params:
            self.param_shards = [f[b.lo:b.hi].clone() for b, f in zip(self.buckets, self.param_flats)]
            for bi, b in enumerate(self.buckets):
                self._release(bi)
            self._install_zero3_hooks()
        else:
            for b, f in zip(self.buckets, self.param_flats):
                b.bind(f)

    # -- layout ---------------------------------------------------------------------------------
    def _size_params(self) -> list[list[nn.Parameter]]:
        params = [p for p in self.model.parameters() if p.requires_grad][::-1]
        limit, groups, size = self.config.bucket_mb * 2**20, [[]], 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if groups[-1] and (size + nbytes > limit or p.dtype != groups[-1][0].dtype):
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += nbytes
        return [g for g in groups if g]

    def _unit_params(self) -> list[list[nn.Parameter]]:
        seen: set[int] = set()
        self.units = _units(self.model)
        groups = []
        for unit in self.units:
            ps = [p for p in unit.parameters() if id(p) not in seen and p.requires_grad]
            seen.update(map(id, ps))
            groups.append(ps)
        root = [p for p in self.model.parameters() if id(p) not in seen and p.requires_grad]
        self.root = len(groups) if root else None
        groups = groups + ([root] if root else [])
        keep = [i for i, g in enumerate(groups) if g]
        self._unit_bucket = {i: keep.index(i) for i in keep if i < len(self.units)}
        if self.root is not None:
            self.root = keep.index(self.root)
        return [groups[i] for i in keep]

    # -- gradients ------------------------------------------------------------------------------
    def _grad_hook(self, bi: int, i: int):
        # ZeRO-3's root (embeddings, final norm) gets gradients at both ends of backward: its
        # parameters keep their own .grad until the last arrives and are copied into the flat
        # then, so the whole root flat is not held through backward (FSDP2 holds no more either).
        lazy = self.stage.shard_params and bi == self.root

        def hook(p: nn.Parameter) -> None:
            b = self.buckets[bi]
            if not lazy:
                self._accumulate(bi, i, p)
            self._got.add((bi, i))
            self._ready[bi] += 1
            if self._ready[bi] == len(b.params):
                self._ready[bi] = 0
                if lazy:
                    for j, q in enumerate(b.params):
                        self._accumulate(bi, j, q)
                if self.stage.shard_params and bi != self.root:
                    self._release(bi)          # its backward is done: free the gathered layer now
                if self.sync or self.stage.reduces_every_micro_batch:
                    self.queue.submit(self._reduce, bi)
        return hook

    def _accumulate(self, bi: int, i: int, p: nn.Parameter) -> None:
        """Add p.grad into its slot of bucket bi's gradient flat, and drop it."""
        if self.grad_flats[bi] is None:
            self.grad_flats[bi] = self.buckets[bi].empty()
        self.buckets[bi].slot(i, self.grad_flats[bi]).add_(p.grad.reshape(-1))
        p.grad = None

    def _reduce(self, bi: int) -> None:
        b, flat = self.buckets[bi], self.grad_flats[bi]
        solo = self.topology.dp == 1      # one rank: the sum is the gradient (and no process group is needed)
        if not self.stage.shard_optimizer:
            if not solo:
                comm.all_reduce(flat, op="sum", group=self.group, algorithm=self.config.algorithm_for("all_reduce"))
            return
        if solo:
            out = flat.clone()
        else:
            out = b.empty(shard=True)
            comm.reduce_scatter_tensor(out, flat, op="sum", group=self.group,
                                       algorithm=self.config.algorithm_for("reduce_scatter"))
        if self.grad_shards[bi] is None:
            self.grad_shards[bi] = out
        else:
            self.grad_shards[bi].add_(out)
        if self.stage.shard_grads:
            self.grad_flats[bi] = None
        if bi == self.root and self.stage.shard_params:
            self._release(bi)                  # the root is used at both ends: kept until here

    def finish_backward(self) -> None:
        """Wait for this micro-batch's collectives (call after every backward)."""
        self.queue.drain()
        got, self._got = self._got, set()
        self._ready = [0] * len(self.buckets)
        if got and len(got) < sum(len(b.params) for b in self.buckets):
            names = {id(p): n for n, p in self.model.named_parameters()}
            missing = [names.get(id(p), str(tuple(p.shape))) for bi, b in enumerate(self.buckets)
                       for i, p in enumerate(b.params) if (bi, i) not in got]
            raise RuntimeError(f"parameters got no gradient in this backward: {', '.join(missing[:6])}"
                               f"{' ...' if len(missing) > 6 else ''}; every parameter must take part in the loss")

    def reduced_grads(self) -> list[torch.Tensor]:
        """This rank's summed gradient for each bucket's shard (the whole bucket under DP)."""
        if self.stage.shard_optimizer:
            return [g if g is not None else b.empty(shard=True) for b, g in zip(self.buckets, self.grad_shards)]
        return [g if g is not None else b.empty() for b, g in zip(self.buckets, self.grad_flats)]

    def zero_grad(self) -> None:
        """Zero the gradient accumulators in place (DDP keeps its buckets too: no reallocation)."""
        for bufs in (self.grad_flats, self.grad_shards):
            for t in bufs:
                if t is not None:
                    t.zero_()

    # -- weights --------------------------------------------------------------------------------
    def param_shards_view(self) -> list[torch.Tensor]:
        """The weights each rank's optimizer owns: its shard (the whole bucket under DP)."""
        if self.stage.shard_params:
            return self.param_shards
        return [f[b.lo:b.hi] for b, f in zip(self.buckets, self.param_flats)]

    def after_step(self) -> None:
        """ZeRO-1/2: all-gather the updated shards into every rank's full weights."""
        if self.stage.shard_optimizer and not self.stage.shard_params and self.topology.dp > 1:
            algo = self.config.algorithm_for("all_gather")
            for b, f in zip(self.buckets, self.param_flats):
                self.queue.submit(comm.all_gather_into_tensor, f, f[b.lo:b.hi].clone(),
                                  group=self.group, algorithm=algo)
            self.queue.drain()

    def _gather(self, bi: int) -> torch.Tensor:
        if self.topology.dp == 1:
            return self.param_shards[bi].clone()
        b = self.buckets[bi]
        full = torch.empty(b.padded, dtype=b.dtype, device=b.device)    # every element is overwritten
        self.landing[bi] = full
        comm.all_gather_into_tensor(full, self.param_shards[bi], group=self.group,
                                    algorithm=self.config.algorithm_for("all_gather"))
        return full

    def _prefetch(self, bi: int | None) -> None:
        if bi is not None and self.param_flats[bi] is None and bi not in self._gathering:
            self._gathering[bi] = self.queue.submit(self._gather, bi)

    def _ensure(self, bi: int) -> None:
        if self.param_flats[bi] is None:
            self._prefetch(bi)
            full = self._gathering.pop(bi).result()
            self.landing.pop(bi, None)
            self.buckets[bi].bind(full)
            self.param_flats[bi] = full

    def _release(self, bi: int) -> None:
        self.buckets[bi].unbind()
        self.param_flats[bi] = None

    def _install_zero3_hooks(self) -> None:
        order = [self._unit_bucket[u] for u in range(len(self.units)) if u in self._unit_bucket]
        nxt = {a: b for a, b in zip(order, order[1:])}
        prev = {b: a for a, b in zip(order, order[1:])}
        prefetch = self.config.prefetch

        def root_pre(module, args):
            # A new forward: nothing may be gathered or in flight from before (a forward that
            # raised midway, a layer that did not run): drop it, so no stale weights are used.
            for fut in self._gathering.values():
                fut.result()
            self._gathering.clear()
            self.landing.clear()
            for bi, flat in enumerate(self.param_flats):
                if flat is not None:
                    self._release(bi)
            if self.root is not None:
                self._ensure(self.root)
            if order and prefetch:
                self._prefetch(order[0])

        def root_post(module, args, out):
            if self.root is not None and not torch.is_grad_enabled():
                self._release(self.root)

        self.model.register_forward_pre_hook(root_pre)
        self.model.register_forward_hook(root_post)
        for u, unit in enumerate(self.units):
            if u not in self._unit_bucket:
                continue
            bi = self._unit_bucket[u]

            def pre(module, args, bi=bi):
                self._ensure(bi)
                if prefetch:
                    self._prefetch(nxt.get(bi))

            def post(module, args, out, bi=bi):
                if not _in_backward():       # a recomputed forward keeps its weights for backward
                    self._release(bi)

            def back_pre(module, grad_out, bi=bi):
                self._ensure(bi)
                if prefetch:
                    self._prefetch(prev.get(bi))

            unit.register_forward_pre_hook(pre)
            unit.register_forward_hook(post)
            unit.register_full_backward_pre_hook(back_pre)

    def bucket_layout(self) -> list[tuple[int, bool]]:
        """(elements, is the ZeRO-3 root bucket) of every bucket, in order."""
        return [(b.numel, bi == self.root) for bi, b in enumerate(self.buckets)]

    # -- accounting -----------------------------------------------------------------------------
    def held_bytes(self) -> dict[str, int]:
        """Bytes of weights and gradients this rank holds between steps (tensor sizes, padding included)."""
        def nbytes(ts):
            return sum(t.numel() * t.element_size() for t in ts if t is not None)
        params = nbytes(self.param_shards) if self.stage.shard_params else nbytes(self.param_flats)
        grads = nbytes(self.grad_shards) if self.stage.shard_grads else nbytes(self.grad_flats)
        return {"params": params, "grads": grads}

    def close(self) -> None:
        self.queue.close()


def apply_sharding(model: nn.Module, topology: Topology, config: ShardingConfig) -> Sharded:
    """Lay out `model` for `config.stage` on `topology`'s data-parallel group (see the module doc)."""
    return Sharded(model, topology, config)
