"""Which GPU holds which (tp, dp, pp) coordinate, in any order of the three dimensions.

`order` names the dimensions fastest-varying first. Megatron-LM's ("tp", "dp", "pp"), the default
(Shoeybi et al. 2019 §3; Narayanan et al. 2021 §3.1, and `plan.placement`), gives

    gpu = pp · (dp · tp) + dp_rank · tp + tp_rank,

so a tp group is tp consecutive GPUs, inside one node of 8 when tp ≤ 8. ("dp", "tp", "pp")
spreads each tp group over dp-strided GPUs, across nodes as soon as dp ≥ 8: the placement the
planner's rule forbids, played here to show what it costs. A group's GPUs are an arithmetic
progression, so the groups of a dimension are one (G, size) array, never a Python list per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIMS = ("tp", "dp", "pp")
MEGATRON = "tp,dp,pp"


@dataclass(frozen=True)
class Grid:
    dp: int
    tp: int
    pp: int
    order: tuple[str, ...] = DIMS

    def __post_init__(self) -> None:
        if sorted(self.order) != sorted(DIMS):
            raise ValueError(f"--placement {','.join(self.order)!r} must order each of tp, dp, pp once, "
                             f"fastest first (e.g. {MEGATRON})")

    @classmethod
    def parse(cls, text: str, dp: int, tp: int, pp: int) -> "Grid":
        return cls(dp, tp, pp, tuple(p.strip() for p in text.split(",")))

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def stride(self, dim: str) -> int:
        """GPU distance between neighbours of a `dim` group."""
        out = 1
        for d in self.order[:self.order.index(dim)]:
            out *= getattr(self, d)
        return out

    def gpu(self, *, tp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return tp * self.stride("tp") + dp * self.stride("dp") + pp * self.stride("pp")

    def coords(self, gpu: int) -> dict[str, int]:
        return {d: gpu // self.stride(d) % getattr(self, d) for d in DIMS}

    def groups(self, dim: str, stage: int | None = None) -> np.ndarray:
        """(G, size) GPUs of every `dim` group (member i at coordinate i), those of pipeline stage
        `stage` only when given (a dim other than pp)."""
        others = [d for d in DIMS if d != dim and not (d == "pp" and stage is not None)]
        base = np.zeros(1, dtype=np.int64) + (0 if stage is None else stage * self.stride("pp"))
        for d in others:
            base = (base[:, None] + np.arange(getattr(self, d)) * self.stride(d)).ravel()
        return base[:, None] + np.arange(getattr(self, dim)) * self.stride(dim)


def per_node(groups: np.ndarray, gpus_per_node: int) -> int:
    """Members of each group that share a node, when every group holds whole consecutive blocks of
    one size per node (what the hierarchical algorithms need); 1 otherwise (a ring does not care)."""
    n = groups.shape[1]
    nodes = groups // gpus_per_node      # non-decreasing along a row: members ascend
    first = int((nodes[0] == nodes[0, 0]).sum())
    if n % first:
        return 1
    heads = nodes[:, ::first]
    same = (heads[:, np.arange(n) // first] == nodes).all()
    return first if same and (np.diff(heads, axis=1) > 0).all() else 1
