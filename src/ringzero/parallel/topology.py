"""The rank grid, built once, validated, and passed explicitly (no module-level process groups).

The engine runs data parallelism (with ZeRO) over every rank of `group`; tensor and pipeline
parallelism exist in the planner only for now, so a grid with tp or pp > 1 is rejected here with a
message saying so rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True, kw_only=True)
class Topology:
    """This rank's place in a dp x tp x pp grid (tp and pp are 1 in the engine today)."""

    world: int
    rank: int
    dp: int
    tp: int = 1
    pp: int = 1
    ranks_per_node: int | None = None
    """Ranks sharing a node (hierarchical all-reduce, two-tier cost); None: all of them."""
    group: object = None
    """The data-parallel process group (None: the default group)."""

    def __post_init__(self) -> None:
        if self.tp != 1 or self.pp != 1:
            raise ValueError(f"tp={self.tp}, pp={self.pp}: the training engine runs data parallelism "
                             "(with ZeRO) only; tensor and pipeline parallelism are planned, not run")
        if self.dp * self.tp * self.pp != self.world:
            raise ValueError(f"dp x tp x pp = {self.dp * self.tp * self.pp} must equal the world size {self.world}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world}")

    @property
    def dp_rank(self) -> int:
        return self.rank

    @classmethod
    def data_parallel(cls, group=None, ranks_per_node: int | None = None) -> "Topology":
        """Every rank of `group` (default: the whole job) in one data-parallel group."""
        world = dist.get_world_size(group)
        return cls(world=world, rank=dist.get_rank(group), dp=world, ranks_per_node=ranks_per_node,
                   group=group)
