"""The interface every data-parallel strategy shares, and what they all do the same way.

A strategy lays the model's parameters out in `FlatGroup`s and hooks the model so that gradients are
reduced over the dp group as backward produces them (Li et al. 2020's bucketing: a bucket's
collective starts from a post-accumulate-grad hook once its last gradient has arrived, so
communication overlaps the rest of backward). What is sharded, which collective reduces and when
comes from the strategy's `plan.strategies.sharding.Strategy` (`sharding`); the subclasses in
`data_parallel.py`, `zero/zero12.py` and `zero/zero3.py` say how. Every collective runs on the injected
`CommQueue`, in issue order.

The public interface, all a trainer, optimizer or benchmark uses:

    sync                     False before all but the last micro-batch of a step (DDP's no_sync)
    accumulate_in_place()    from now on, gradients accumulate in the flats and nothing is reduced
                             during backward (then `reduce_now` after the last backward)
    finish_backward()        wait for this micro-batch's collectives; check every gradient came
    owned_weights()          the weights this rank's optimizer updates, one tensor per bucket
    reduced_grads()          their summed gradients (summed over ranks and micro-batches)
    sum_over_owners()        how to sum a tensor over the ranks owning other shards (or None)
    before_step()            what precedes the update (ZeRO-3 parameter offload: load the shards)
    after_step()             what follows the update (ZeRO-1/2: gather the weights)
    zero_grad()              zero the gradient accumulators
    register_comm_hook(h)    reduce each bucket through hook `h` (`parallel.compression`), as DDP's
    settle(skipped, rescale) the step ended: the hook keeps (or, skipped, drops) its staged state
    held_bytes(), transient_bytes(), layout(), full_params(), close()
"""

from __future__ import annotations

import contextlib
import enum

import torch
from torch import nn

from ringzero import comm
from ringzero.plan.strategies.sharding import Strategy
from ringzero.parallel.comm_queue import CommQueue
from ringzero.parallel.compression.slot import HookSlot
from ringzero.parallel.flat import FlatBucket
from ringzero.parallel.flat_group import FlatGroup, Weights, nbytes
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.parallel.topology import Topology
from ringzero.comm.kinds import kind


class Accumulation(enum.Enum):
    HOOKED = "hooked"
    """A hook on each parameter adds its gradient into the flat and reduces a bucket once its last
    gradient arrived (overlapping backward)."""
    IN_PLACE = "in_place"
    """Each parameter's .grad is a view of the flat: autograd accumulates there, no hook runs, and
    the buckets are reduced when the caller says (`reduce_now`)."""


class FlatStrategy:
    """`model` in flat buckets with this strategy's gradient hooks (see the module doc)."""

    sharding: Strategy

    def __init__(self, model: nn.Module, topology: Topology, config: ShardingConfig,
                 queue: CommQueue | None = None, alone: tuple[nn.Parameter, ...] = ()) -> None:
        self.model, self.topology, self.config = model, topology, config
        self.alone = alone
        """Parameters each in a bucket of its own, marked shared (a pipeline's tied embedding: its
        first and last stage must reduce it alike, whatever else they hold)."""
        self._owns_queue = queue is None
        self.queue = CommQueue() if queue is None else queue
        self.group = topology.group
        self.sync = True
        self.nonfinite = False
        """Whether a gradient bucket this rank reduced held an inf or a NaN before reduction (since
        `zero_grad`): where a non-finite step came from."""
        self.poison = False
        """Put an inf into the next bucket reduced (a fault injected on purpose, then cleared)."""
        shards, index = (topology.dp, topology.dp_rank) if self.sharding.shard_optimizer else (1, 0)
        params, root = self._buckets()
        self.groups = [FlatGroup(FlatBucket(ps, shards, index), i, root=i == root) for i, ps in enumerate(params)]
        for g in self.groups:
            g.shared = any(p is q for p in g.params for q in alone)
        self.accumulation, self._hooks = Accumulation.HOOKED, []
        self.comm_hook = HookSlot()
        for g in self.groups:
            g.bind_full()
            for i, p in enumerate(g.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(g, i)))

    def register_comm_hook(self, hook) -> None:
        """Reduce every bucket through `hook` (a `parallel.compression.CommHook`) instead of the
        strategy's own collective, from the hook's start step on."""
        self.comm_hook.register(hook, self)

    def settle(self, skipped: bool, rescale: float = 1.0) -> None:
        """After the optimizer step (`skipped`: for an overflow; `rescale`: the loss scale's change)."""
        self.comm_hook.settle(skipped, rescale)

    def accumulate_in_place(self) -> None:
        """HOOKED -> IN_PLACE (see `Accumulation`): for strategies that reduce once, after their last
        backward (a pipeline's flush), where a per-parameter Python hook is pure cost (~2 us x
        parameters x micro-batches: `python -m timeit -s "import torch; from torch import nn;
        m = nn.Sequential(*[nn.Linear(4, 4) for _ in range(500)]); x = torch.randn(2, 4)"
        "m(x).sum().backward()"`, then with `[p.register_post_accumulate_grad_hook(lambda p: None)
        for p in m.parameters()]` added to the setup, the difference over its 1,000 parameters)
        and a bucket must not be reduced early. Only strategies whose
        weights stay whole (DP, ZeRO-1) can: ZeRO-2/3 reduce during backward by design."""
        if self.sharding.reduces_every_micro_batch or self.sharding.shard_params:
            raise ValueError(f"{type(self).__name__} reduces during backward; it cannot accumulate in place")
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for g in self.groups:
            g.bind_grads()
        self.accumulation = Accumulation.IN_PLACE

    # -- layout ---------------------------------------------------------------------------------
    def _buckets(self) -> tuple[list[list[nn.Parameter]], int | None]:
        """Parameters in buckets of `config.bucket_mb` (one dtype each) in reverse registration order,
        roughly the order backward produces their gradients, each of `alone` by itself; no root bucket."""
        params = [p for p in self.model.parameters() if p.requires_grad][::-1]
        limit, groups, size = self.config.bucket_mb * 2**20, [[]], 0
        solo = lambda p: any(p is q for q in self.alone)          # noqa: E731 - by identity, not ==
        for p in params:
            n = p.numel() * p.element_size()
            last = groups[-1]
            if last and (size + n > limit or p.dtype != last[0].dtype or solo(p) or solo(last[0])):
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += n
        return [g for g in groups if g], None

    # -- gradients ------------------------------------------------------------------------------
    def _grad_hook(self, g: FlatGroup, i: int):
        def hook(p: nn.Parameter) -> None:
            self._arrive(g, i, p)
            g.got.add(i)
            g.arrived += 1
            if g.arrived == len(g.params):
                g.arrived = 0
                self._bucket_done(g)
        return hook

    def _arrive(self, g: FlatGroup, i: int, p: nn.Parameter) -> None:
        g.accumulate(i, p)

    def _bucket_done(self, g: FlatGroup) -> None:
        """Bucket g has every gradient of this backward: reduce it when the strategy's table says so."""
        if self.sync or self.sharding.reduces_every_micro_batch:
            self.queue.submit(self._checked_reduce, g)

    def _checked_reduce(self, g: FlatGroup) -> None:
        """`_reduce` under the kind of the strategy's gradient collective (the planner prices its
        calls under the same), after noting whether this rank's own gradient is finite: one fp32
        sum over the bucket (non-finite exactly when an element is, short of an fp32 overflow)."""
        if g.grad_flat is not None:
            if self.poison:
                g.grad_flat[0] = float("inf")
                self.poison = False
            g.finite = bool(torch.isfinite(torch.sum(g.grad_flat, dtype=torch.float32)))
            self.nonfinite |= not g.finite
        with kind(self.sharding.gradient.kind):
            self._reduce(g)

    def _reduce(self, g: FlatGroup) -> None:
        raise NotImplementedError

    def _algorithm(self, collective: str) -> str:
        return self.config.algorithm_for(collective)

    def finish_backward(self) -> None:
        """Wait for this micro-batch's collectives (call after every backward)."""
        self.queue.drain()
        got = sum(len(g.got) for g in self.groups)
        missing = [p for g in self.groups for p in g.missing()] if got else []
        for g in self.groups:
            g.got, g.arrived = set(), 0
        if missing:
            names = {id(p): n for n, p in self.model.named_parameters()}
            listed = [names.get(id(p), str(tuple(p.shape))) for p in missing]
            raise RuntimeError(f"parameters got no gradient in this backward: {', '.join(listed[:6])}"
                               f"{' ...' if len(listed) > 6 else ''}; every parameter must take part in the loss")

    def reduce_now(self) -> None:
        """Reduce every bucket's accumulated gradients at once and wait (pipeline schedules: a
        stage's chunks end their backwards at different times, so the dp reduction follows the
        pipeline's flush, as in Megatron-LM), then reset the arrival bookkeeping."""
        for g in self.groups:
            self.queue.submit(self._checked_reduce, g)
        self.finish_backward()

    def unreduced_grad(self, p: nn.Parameter) -> torch.Tensor:
        """The view of parameter `p`'s gradient in its bucket's unreduced flat (summed over this
        rank's micro-batches so far), to be summed with another copy's before `reduce_now`."""
        for g in self.groups:
            for q, view in zip(g.params, g.bucket.views(g.grad_flat)) if g.grad_flat is not None else ():
                if q is p:
                    return view
        raise KeyError("parameter has no accumulated gradient in this strategy")

    def reduced_grads(self) -> list[torch.Tensor]:
        """This rank's summed gradient for each bucket's shard (the whole bucket when unsharded)."""
        if self.sharding.shard_optimizer:
            return [g.grad_shard if g.grad_shard is not None else g.bucket.empty(shard=True) for g in self.groups]
        return [g.grad_flat if g.grad_flat is not None else g.bucket.empty() for g in self.groups]

    def sum_over_owners(self):
        """A function that sums a tensor in place over the ranks whose gradient shards differ (for
        the global norm); None when every rank holds every gradient."""
        if not (self.sharding.norm_all_reduce and self.topology.dp > 1):
            return None

        def reduce(t: torch.Tensor) -> None:
            self.queue.submit(comm.all_reduce, t, op="sum", group=self.group,
                              algorithm=self._algorithm("all_reduce"))
            self.queue.drain()
        return reduce

    def zero_grad(self) -> None:
        self.nonfinite = False
        for g in self.groups:
            g.zero_grad()

    # -- weights --------------------------------------------------------------------------------
    def owned_weights(self) -> list[torch.Tensor]:
        return [g.owned_weights() for g in self.groups]

    def shards_at_hand(self, changed: bool = False):
        """A block in which `owned_weights()` hold this rank's weights (they always do here; ZeRO-3
        with its weights offloaded loads them for it)."""
        return contextlib.nullcontext()

    def before_step(self) -> None:
        """Nothing by default (the owned weights stay where the optimizer updates them)."""

    def after_step(self) -> None:
        """Nothing by default (DP updated the whole model on every rank)."""

    def _gather(self, g: FlatGroup) -> torch.Tensor:
        """The bucket's full weights from every rank's shard (on the queue's thread): only a
        strategy that shards the weights has a bucket that is not FULL."""
        raise NotImplementedError

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter's value on this rank (gathered over dp when sharded), by name."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        out = {}
        for g in self.groups:
            flat = g.full
            if g.weights not in (Weights.FULL, Weights.GATHERED):
                flat = self.queue.submit(self._gather, g).result()
                g.landing = None
            for p, v in zip(g.params, g.bucket.views(flat)):
                out[names[id(p)]] = v.detach()
        return out

    # -- accounting -----------------------------------------------------------------------------
    def layout(self) -> list[tuple[int, bool, list[tuple[int, ...]]]]:
        """(elements, is ZeRO-3's root bucket, its parameters' shapes) of every bucket, in order."""
        return [(g.bucket.numel, g.root, [tuple(s) for s in g.bucket.shapes]) for g in self.groups]

    def held_bytes(self) -> dict[str, int]:
        """Bytes of weights and gradients this rank holds between steps (tensor sizes, padding included)."""
        s = self.sharding
        params = nbytes(g.shard for g in self.groups) if s.shard_params else nbytes(g.full for g in self.groups)
        grads = nbytes(g.grad_shard if s.shard_grads else g.grad_flat for g in self.groups)
        return {"params": params, "grads": grads}

    def transient_bytes(self) -> int:
        """Full-size buffers alive now beyond what is held between steps: gathered layers, all-gather
        outputs being filled, unreduced gradient flats and parameter gradients not yet in a flat."""
        s = self.sharding
        n = nbytes(g.full for g in self.groups) + nbytes(g.landing for g in self.groups) if s.shard_params else 0
        if self.accumulation is Accumulation.HOOKED:      # in place, .grad is a view of the flat
            n += nbytes(p.grad for g in self.groups for p in g.params)
        return n + (nbytes(g.grad_flat for g in self.groups) if s.shard_grads else 0)

    def offload_bytes(self) -> dict[str, int]:
        """Weight-shard bytes kept off the device, by location (ZeRO-3's parameter offload; none here)."""
        return {"device": 0, "host": 0, "disk": 0}

    def offload_io_bytes(self) -> dict[str, int]:
        """Disk bytes the weight shards moved in the latest step (parameter offload to NVMe; none here)."""
        return {"read": 0, "write": 0}

    def close(self) -> None:
        """Stop the communication thread when this strategy made it."""
        if self._owns_queue:
            self.queue.close()
