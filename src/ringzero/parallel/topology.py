"""The engine's rank grid: a `plan.placement.Placement` with one process group per dimension.

Built once (`Topology.build`), validated at construction, and passed explicitly; nothing reads a
module-level group. It holds this rank's coordinates and the process groups of its dp, tp and pp
groups and of its dp x tp group (where a loss or a norm spans both), each a plain
`torch.distributed` group that `ringzero.comm` collectives take as `group=`.

Why not torch's `init_device_mesh`: a DeviceMesh is built by every rank of the default group, while
ringzero runs grids on a subset of a live pool of ranks (tests, benchmarks) and on any group a caller
passes in. The groups are made with `new_group(..., use_local_synchronization=True)`, which only
their members enter, in one global order (every tp group, then dp, then pp, then dp x tp), so
overlapping groups cannot deadlock. torch names such a group after its ranks and the number of groups
the creating rank already belongs to, so the members must agree on that number: before each
creation the grid's ranks take the maximum of their counts and the ranks behind join one-rank groups
until they reach it. Groups are kept for the life of the process, by their ranks (a group of the same
ranks is never made twice, so no name is reused). A dimension that spans the caller's whole group is
that group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ringzero.plan.placement import Placement
from ringzero.plan.strategies.zeropp import ZeroPP, group_members

KINDS = (("tp",), ("dp",), ("pp",), ("dp", "tp"), ("dp", "tp", "pp"))


_GROUPS: dict[tuple[int, ...], object] = {}
"""Process groups made so far, by their global ranks."""


def _group_count() -> int | None:
    # torch keeps no public count of the groups a rank belongs to; this is what its naming reads
    # (None where a torch version keeps it elsewhere: then nothing is aligned).
    names = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_names", None)
    return None if names is None else len(names)


def _align_group_counts(whole_group) -> None:
    """Bring every rank of `whole_group` to the same number of groups (see the module doc)."""
    if _group_count() is None:
        return
    count = torch.tensor([_group_count()], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=whole_group)
    me = dist.get_rank()
    while _group_count() < int(count):
        dist.new_group([me], use_local_synchronization=True)


def _new_group(global_ranks: tuple[int, ...], whole: tuple[int, ...], whole_group):
    """The process group of `global_ranks` (every rank of the caller's group calls this)."""
    if global_ranks == whole:
        return whole_group
    _align_group_counts(whole_group)
    if global_ranks not in _GROUPS:
        _GROUPS[global_ranks] = dist.new_group(list(global_ranks), use_local_synchronization=True)
    return _GROUPS[global_ranks]


@dataclass(frozen=True, kw_only=True)
class Topology:
    """This rank's place in a dp x tp x pp grid, and the process groups of its dimensions."""

    world: int
    rank: int
    dp: int
    tp: int = 1
    pp: int = 1
    ranks_per_node: int | None = None
    """Ranks sharing a node (hierarchical all-reduce, two-tier cost); None: all of them."""
    groups: dict[tuple[str, ...], object] = field(default_factory=dict)
    """("dp",), ("tp",), ("pp",), ("dp", "tp") -> process group (absent, or None: the default group
    for a one-dimensional grid; alone: no group needed)."""

    def __post_init__(self) -> None:
        # Placement checks the degrees; the world and rank are checked against it.
        p = self.placement
        if p.world != self.world:
            raise ValueError(f"dp x tp x pp = {self.dp} x {self.tp} x {self.pp} = {p.world} must equal the "
                             f"world of {self.world} ranks")
        p.coords(self.rank)

    @property
    def placement(self) -> Placement:
        return Placement(dp=self.dp, tp=self.tp, pp=self.pp, ranks_per_node=self.ranks_per_node)

    @property
    def coords(self) -> dict[str, int]:
        return self.placement.coords(self.rank)

    @property
    def dp_rank(self) -> int:
        return self.coords["dp"]

    @property
    def tp_rank(self) -> int:
        return self.coords["tp"]

    @property
    def pp_rank(self) -> int:
        return self.coords["pp"]

    @property
    def group(self):
        """The data-parallel process group (where gradients are reduced)."""
        return self.groups.get(("dp",))

    @property
    def tp_group(self):
        return self.groups.get(("tp",))

    @property
    def pp_group(self):
        return self.groups.get(("pp",))

    @property
    def grid_group(self):
        """Every rank of the grid."""
        return self.groups.get(("dp", "tp", "pp"), self.dp_tp_group)

    @property
    def embedding_group(self):
        """The first and last pipeline stage of this rank's (dp, tp) coordinates: where the tied
        embedding's gradient is summed (a one-rank group on the stages between)."""
        return self.groups.get(("embedding",))

    @property
    def dp_tp_group(self):
        return self.groups.get(("dp", "tp"))

    @property
    def dp_node_group(self):
        """ZeRO++: this rank's block of `dp_partition` consecutive dp ranks (one node's share)."""
        return self.groups.get(("dp_node",))

    @property
    def dp_cross_group(self):
        """ZeRO++: the dp ranks with this rank's index in every block (one per node)."""
        return self.groups.get(("dp_cross",))

    @classmethod
    def build(cls, placement: Placement, group=None, dp_partition: int | None = None) -> "Topology":
        """The grid `placement` over the ranks of `group` (default: the whole job), with its process
        groups; every rank of `group` must call it. With `dp_partition` H, also ZeRO++'s groups of the
        dp group cut in blocks of H (`plan.strategies.zeropp`): "dp_node" and "dp_cross"."""
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if placement.world != world:
            raise ValueError(f"dp x tp x pp = {placement.dp} x {placement.tp} x {placement.pp} = "
                             f"{placement.world} must equal the world of {world} ranks")
        whole = tuple(dist.get_process_group_ranks(group) if group is not None else range(world))
        groups = {}
        for dims in KINDS:                              # one global order on every rank
            members = placement.group(dims, rank)
            groups[dims] = _new_group(tuple(whole[r] for r in members), whole, group)
        if placement.pp > 1:                            # last, so every rank makes it in the same place
            members = placement.embedding_members(rank)
            groups[("embedding",)] = _new_group(tuple(whole[r] for r in members), whole, group)
        if dp_partition is not None:                    # after the grid's, in one order everywhere
            zpp = ZeroPP(partition=dp_partition)
            dp_members, dp_rank = placement.group(("dp",), rank), placement.coords(rank)["dp"]
            for kind in ("dp_node", "dp_cross"):
                members = group_members(zpp, kind, dp_members, dp_rank)
                groups[(kind,)] = _new_group(tuple(whole[r] for r in members), whole, group)
        return cls(world=world, rank=rank, dp=placement.dp, tp=placement.tp, pp=placement.pp,
                   ranks_per_node=placement.ranks_per_node, groups=groups)

    @classmethod
    def data_parallel(cls, group=None, ranks_per_node: int | None = None) -> "Topology":
        """Every rank of `group` (default: the whole job) in one data-parallel group."""
        world = dist.get_world_size(group)
        return cls(world=world, rank=dist.get_rank(group), dp=world, ranks_per_node=ranks_per_node,
                   groups={("dp",): group, ("dp", "tp"): group})

    @classmethod
    def alone(cls) -> "Topology":
        """One rank, no process group."""
        return cls(world=1, rank=0, dp=1)
