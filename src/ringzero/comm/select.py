"""algorithm="auto": the algorithm with the least predicted time (placeholder defaults for now)."""

from __future__ import annotations

_DEFAULTS = {
    "all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring", "broadcast": "tree",
    "reduce": "tree", "gather": "tree", "scatter": "tree", "all_to_all": "pairwise",
}


def choose(collective: str, n: int, nbytes: int, ranks_per_node: int) -> str:
    return _DEFAULTS[collective]
