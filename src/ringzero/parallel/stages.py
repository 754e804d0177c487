"""How a data-parallel strategy runs, besides what it shards (`plan.sharding`: the one table of the
strategies and their collectives, re-exported here for the engine's callers)."""

from __future__ import annotations

from dataclasses import dataclass

from ..comm import registry
from ..plan.sharding import DP, STRATEGIES, ZERO1, ZERO2, ZERO3, Strategy  # noqa: F401
from ..plan.sharding import strategy as stage  # noqa: F401


@dataclass(frozen=True, kw_only=True)
class ShardingConfig:
    """How a strategy runs (besides what it shards: `stage`, a `plan.sharding.Strategy`)."""

    stage: Strategy = DP
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
