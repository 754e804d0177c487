"""What each data-parallel strategy shards and the collectives of its step, written once.

Rajbhandari et al. 2020 (§5): DP replicates everything and all-reduces gradients (Li et al. 2020's
bucketed all-reduce, once per step: accumulation communicates only on the last micro-batch). ZeRO-1
shards the optimizer states: gradients are reduce-scattered, each rank updates its shard, the weights
are all-gathered after the step. ZeRO-2 also shards gradients, so the reduce-scatter runs after every
micro-batch (the full gradient is freed). ZeRO-3 also shards weights: a layer is all-gathered before
its forward and again before its backward, every micro-batch, its gradients reduce-scattered, and
nothing is gathered after the step (§7: 3Φ of traffic against DP's 2Φ).

This table is the only description of those schedules: the engine's strategy classes read what to
shard and when to reduce and gather from it (`ringzero.parallel`), `twin.predict` prices it per flat
bucket and `plan.strategies.traffic` for the whole model (Φ). `shard_numel` and `padded_numel` are
the one formula of a sharded bucket's size, ⌈n/N⌉ and ⌈n/N⌉·N, for the planner and the engine alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.comm.kinds import GRADIENT, NORM, WEIGHTS, Call
from ringzero.plan.strategies.compression import Compression, bucket_calls


def shard_numel(numel: int, ranks: int) -> int:
    """⌈n/N⌉: the elements of each rank's shard of a flat bucket of `numel` over `ranks` dp ranks.
    ZeRO pads a bucket with zeros to N equal shards (Rajbhandari et al. 2020 §5; FSDP's
    FlatParameter does the same), so every rank's shard, and every collective's chunk, is this size."""
    return -(-numel // ranks)


def padded_numel(numel: int, ranks: int) -> int:
    """⌈n/N⌉·N: the bucket with its zero padding, the elements its reduce-scatter and all-gather move."""
    return shard_numel(numel, ranks) * ranks


@dataclass(frozen=True)
class Collective:
    """One collective a strategy runs on every flat bucket (over the dp group)."""

    collective: str
    """"all_reduce", "reduce_scatter" or "all_gather"."""
    what: str
    per_micro_batch: int
    """Calls per micro-batch; 0: once per step."""
    overlap: str
    """The compute it can hide behind: "forward", "backward" or "none"."""
    kind: str = GRADIENT
    """What it is for (`plan.comm.kinds`): the planner's calls carry it, and the engine runs this
    collective under it."""
    layers_only: bool = False
    """Not for ZeRO-3's root bucket (embeddings, final norm): it is used at both ends of the model,
    so it stays gathered from the forward through the backward."""

    def times(self, micro_batches: int, root: bool = False) -> int:
        """Calls per step on one bucket."""
        if self.layers_only and root:
            return 0
        return self.per_micro_batch * micro_batches if self.per_micro_batch else 1


@dataclass(frozen=True)
class Strategy:
    """Which model states a strategy partitions across the dp ranks, and its collectives per bucket."""

    name: str
    zero: int
    shard_optimizer: bool
    shard_grads: bool
    shard_params: bool
    collectives: tuple[Collective, ...]

    @property
    def gradient(self) -> Collective:
        """The collective that reduces gradients (the first)."""
        return self.collectives[0]

    @property
    def weight_gathers(self) -> tuple[Collective, ...]:
        """Its all-gathers of weights: after the step (ZeRO-1/2), before forward and backward (ZeRO-3)."""
        return tuple(c for c in self.collectives if c.kind == WEIGHTS)

    @property
    def reduces_every_micro_batch(self) -> bool:
        """Sharded gradients cannot wait for the last micro-batch: the full gradient is freed."""
        return self.gradient.per_micro_batch > 0

    @property
    def gathers_after_step(self) -> bool:
        """ZeRO-1/2: the updated shards are all-gathered into every rank's full weights."""
        return any(c.collective == "all_gather" and not c.per_micro_batch for c in self.collectives)

    @property
    def norm_all_reduce(self) -> bool:
        """Each rank holds a different gradient shard, so the squared global norm (for clipping and
        the fp16 overflow check) is summed over the ranks: one fp32 all-reduce of one number."""
        return self.shard_optimizer

    def calls(self, buckets: list[tuple], ranks: int, itemsize: int, micro_batches: int,
              compression: Compression | None = None) -> list[Call]:
        """The `Call`s of one step over `buckets` of (elements, is ZeRO-3's root[, its parameters'
        shapes]) on `ranks` dp ranks: a sharded bucket is padded to a multiple of the ranks. With
        `compression`, the gradient's reduction is the scheme's calls (`compression.bucket_calls`,
        which needs the shapes), each of the gradient's kind."""
        if ranks == 1:
            return []
        out = []
        for numel, root, *shapes in buckets:
            count = numel if not self.shard_optimizer else padded_numel(numel, ranks)
            for c in self.collectives:
                times = c.times(micro_batches, root)
                if times and compression is not None and compression.on and c is self.gradient:
                    out += [Call(*call, times, c.kind) for call in bucket_calls(
                        compression, shapes[0] if shapes else [], numel, count, ranks, itemsize, c.collective)]
                elif times:
                    out.append(Call(c.collective, count, itemsize, times, c.kind))
        if self.norm_all_reduce:
            out.append(NORM_CALL)
        return out


NORM_CALL = Call("all_reduce", 1, 4, 1, NORM)
"""The squared global gradient norm summed over a group: one fp32 per step."""


_ALL_REDUCE = Collective("all_reduce", "gradient all-reduce", 0, "backward")
_GATHER_AFTER = Collective("all_gather", "weight all-gather after the step", 0, "none", WEIGHTS)

DP = Strategy("dp", 0, False, False, False, (_ALL_REDUCE,))
ZERO1 = Strategy("zero1", 1, True, False, False,
                 (Collective("reduce_scatter", "gradient reduce-scatter", 0, "backward"), _GATHER_AFTER))
ZERO2 = Strategy("zero2", 2, True, True, False,
                 (Collective("reduce_scatter", "gradient reduce-scatter", 1, "backward"), _GATHER_AFTER))
ZERO3 = Strategy("zero3", 3, True, True, True,
                 (Collective("reduce_scatter", "gradient reduce-scatter", 1, "backward"),
                  Collective("all_gather", "weight all-gather before forward", 1, "forward", WEIGHTS),
                  Collective("all_gather", "weight all-gather before backward", 1, "backward", WEIGHTS,
                             layers_only=True)))

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (DP, ZERO1, ZERO2, ZERO3)}
"""Every data-parallel strategy, by name (the engine's `--strategy` adds "single": DP on one rank)."""


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def by_zero(zero: int) -> Strategy:
    """The strategy of ZeRO stage `zero` (0: DP)."""
    return next(s for s in STRATEGIES.values() if s.zero == zero)
