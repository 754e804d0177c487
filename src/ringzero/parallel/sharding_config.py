"""How a data-parallel strategy runs, besides what it shards (`sharding`, a row of
`plan.strategies.sharding`: the one table of the strategies and their collectives)."""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.comm import registry
from ringzero.plan.comm.algorithms import for_collective
from ringzero.plan.strategies.zeropp import ZeroPP
from ringzero.plan.strategies.sharding import DP, ZERO3, Strategy


@dataclass(frozen=True, kw_only=True)
class ShardingConfig:
    """How a strategy runs (besides what it shards: `sharding`, a `plan.strategies.sharding.Strategy`)."""

    sharding: Strategy = DP
    bucket_mb: float = 25.0
    """Gradient bucket size in MiB for DP/ZeRO-1/2 (DDP's default is 25); ZeRO-3 uses one bucket
    per layer."""
    algorithm: str = "auto"
    """`ringzero.comm` algorithm: "auto", "torch", or an all-reduce algorithm name (reduce-scatter
    and all-gather then use their ring, unless the name is one of theirs)."""
    prefetch: int = 1
    """ZeRO-3: layers gathered ahead of the one computing (0: none; FSDP2's forward prefetch is 1).
    The planner's ZeRO-3 buffers read the same depth (`plan.strategies.memory.zero3_layers_held`)."""
    zeropp: ZeroPP | None = None
    """ZeRO-3 only: the ZeRO++ options (qwZ, hpZ, qgZ) and their node blocks (`plan.strategies.zeropp`)."""
    offload_params: object | None = None
    """ZeRO-3 only: a `parallel.offload.config.OffloadConfig` saying where the weight shards live between
    uses (cpu or nvme: `parallel.offload.zero3`); None: on the device."""

    def __post_init__(self) -> None:
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {self.bucket_mb}")
        registry.check_name("all_reduce", self.algorithm)
        if self.zeropp is not None and self.sharding is not ZERO3:
            raise ValueError(f"ZeRO++ ({', '.join(self.zeropp.on)}) runs on ZeRO-3, not {self.sharding.name}")
        if self.offload_params is not None and self.sharding is not ZERO3:
            raise ValueError(f"parameter offload runs on ZeRO-3, not {self.sharding.name}")
        if not isinstance(self.prefetch, int) or isinstance(self.prefetch, bool) or self.prefetch < 0:
            raise ValueError(f"prefetch is a number of layers >= 0, got {self.prefetch!r}")

    def algorithm_for(self, collective: str) -> str:
        return for_collective(self.algorithm, collective)
