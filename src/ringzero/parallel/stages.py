"""What each data-parallel strategy shards, as types (as FSDP2's `ShardedState`), and its configuration.

Rajbhandari et al. 2020 (§5): DP replicates everything and all-reduces gradients;
ZeRO-1 shards the optimizer states (reduce-scatter gradients, update the own shard, all-gather
weights); ZeRO-2 also shards gradients (each bucket is reduce-scattered during backward and the
full gradient freed); ZeRO-3 also shards weights (all-gather each layer before its forward and
again before its backward, free it after, reduce-scatter its gradients, no final all-gather).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm import registry


@dataclass(frozen=True)
class Stage:
    """Which model states a strategy partitions across the data-parallel ranks."""

    name: str
    zero: int
    shard_optimizer: bool
    shard_grads: bool
    shard_params: bool

    @property
    def reduces_every_micro_batch(self) -> bool:
        """Sharded gradients cannot wait for the last micro-batch: the full gradient is freed."""
        return self.shard_grads


DP = Stage("dp", 0, False, False, False)
ZERO1 = Stage("zero1", 1, True, False, False)
ZERO2 = Stage("zero2", 2, True, True, False)
ZERO3 = Stage("zero3", 3, True, True, True)
STAGES = {s.name: s for s in (DP, ZERO1, ZERO2, ZERO3)}


def stage(name: str) -> Stage:
    if name not in STAGES:
        raise ValueError(f"unknown strategy {name!r}; allowed: {', '.join(STAGES)}")
    return STAGES[name]


@dataclass(frozen=True, kw_only=True)
class ShardingConfig:
    """How a strategy runs (besides its `Stage`)."""

    stage: Stage = DP
    bucket_mb: float = 25.0
    """Gradient bucket size in MiB for DP/ZeRO-1/2 (DDP's default is 25); ZeRO-3 uses one bucket
    per layer."""
    algorithm: str = "auto"
    """`ringzero.comm` algorithm: "auto", "torch", or an all-reduce algorithm name (reduce-scatter
    and all-gather then use their ring, unless the name is one of theirs)."""
    prefetch: bool = True
    """ZeRO-3: gather the next layer while the current one computes."""

    def __post_init__(self) -> None:
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {self.bucket_mb}")
        registry.check_name("all_reduce", self.algorithm)

    def algorithm_for(self, collective: str) -> str:
        if self.algorithm in ("auto", "torch"):
            return self.algorithm
        if self.algorithm in registry.algorithms(collective):
            return self.algorithm
        return "ring"
