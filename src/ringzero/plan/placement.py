"""Where each rank sits in a dp x tp x pp grid: a pure description, shared by planner and engine.

Megatron-LM's order (Shoeybi et al. 2019 §3; Narayanan et al. 2021 §3.1): tensor parallelism varies
fastest, then data parallelism, then pipeline stages, so

    rank = pp_rank · (dp · tp) + dp_rank · tp + tp_rank.

A tp group is tp consecutive ranks (inside one node whenever tp divides the node: its all-reduces,
four per layer, are the most frequent traffic), a dp group strides by tp, a pp group by dp · tp.
Nodes hold `ranks_per_node` consecutive ranks, so how many members of a group share a node follows
from its stride (`node_share`); the planner prices each group's collectives with that, and the
engine builds its process groups from `groups`.
"""

from __future__ import annotations

from dataclasses import dataclass

DIMS = ("tp", "dp", "pp")
"""Fastest-varying first."""


def node_share(stride: int, size: int, ranks_per_node: int) -> int:
    """Members of a group of `size` ranks spaced `stride` apart that fall in one node."""
    return max(1, min(size, ranks_per_node // stride)) if stride < ranks_per_node else 1


@dataclass(frozen=True, kw_only=True)
class Placement:
    """A dp x tp x pp grid of dp·tp·pp ranks, nodes of `ranks_per_node` consecutive ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ranks_per_node: int | None = None
    """Ranks sharing a node (None: all of them, one node)."""

    def __post_init__(self) -> None:
        for k in ("dp", "tp", "pp"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{k} must be an integer >= 1, got {v!r}")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")

    @classmethod
    def for_world(cls, world: int, *, tp: int = 1, pp: int = 1, dp: int | None = None,
                  ranks_per_node: int | None = None) -> "Placement":
        """The grid of `world` ranks with the given tp and pp (dp: world / (tp·pp) unless given);
        raises ValueError naming the mismatch when the degrees do not multiply to `world`."""
        for k, v in (("tp", tp), ("pp", pp)):
            if v < 1:
                raise ValueError(f"{k} must be >= 1, got {v}")
            if v > world:
                raise ValueError(f"{k}={v} is larger than the world of {world} ranks")
        if dp is None:
            if world % (tp * pp):
                raise ValueError(f"the world of {world} ranks is not a multiple of tp x pp = {tp} x {pp}")
            dp = world // (tp * pp)
        if dp * tp * pp != world:
            raise ValueError(f"dp x tp x pp = {dp} x {tp} x {pp} = {dp * tp * pp} must equal the world of "
                             f"{world} ranks")
        return cls(dp=dp, tp=tp, pp=pp, ranks_per_node=ranks_per_node)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def size(self, dim: str) -> int:
        return getattr(self, dim)

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours of a `dim` group."""
        return {"tp": 1, "dp": self.tp, "pp": self.tp * self.dp}[dim]

    def coords(self, rank: int) -> dict[str, int]:
        """{"tp": i, "dp": j, "pp": k} of `rank`."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not in a grid of {self.world} ranks")
        return {"tp": rank % self.tp, "dp": rank // self.tp % self.dp, "pp": rank // (self.tp * self.dp)}

    def rank(self, *, tp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return pp * self.tp * self.dp + dp * self.tp + tp

    def group(self, dims: tuple[str, ...], rank: int) -> tuple[int, ...]:
        """The ranks sharing every coordinate of `rank` except those in `dims` (e.g. ("dp",): its dp
        group; ("dp", "tp"): its dp x tp group), ascending."""
        c = self.coords(rank)
        members = [r for r in range(self.world)
                   if all(self.coords(r)[d] == c[d] for d in DIMS if d not in dims)]
        return tuple(members)

    def embedding_members(self, rank: int) -> tuple[int, ...]:
        """The ranks that hold `rank`'s tied embedding under a pipeline: the first and the last stage
        of its (tp, dp) column, which sum its gradient; `rank` alone on a stage between them."""
        c = self.coords(rank)
        if c["pp"] not in (0, self.pp - 1):
            return (rank,)
        return (self.rank(tp=c["tp"], dp=c["dp"], pp=0), self.rank(tp=c["tp"], dp=c["dp"], pp=self.pp - 1))

    def node_size(self, dim: str) -> int:
        """Members of a `dim` group that share a node."""
        rpn = self.ranks_per_node or self.world
        return node_share(self.stride(dim), self.size(dim), rpn)
