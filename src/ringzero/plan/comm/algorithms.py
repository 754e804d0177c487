"""Every collective's algorithms, by name: the one table that the code, the formulas and the flags read.

An algorithm is two files of the same name: its code, the function named after the collective in
`ringzero.comm.algorithms.<module>`, and its exact traffic, the function of the same name in
`ringzero.plan.comm.volumes.<module>`. `comm.registry` (which runs it), `plan.comm.volume` (which
prices it), `plan.config` (`--dp-algorithm`) and `plan.step_time` derive their names from here, so
that an algorithm added to this table is offered, run and priced everywhere at once.

The order is the order of the help texts and error messages, and it breaks ties: when two
algorithms are predicted equally fast, `comm.select` and `plan.step_time` take the first listed.

This module imports nothing, so that the planner stays free of torch.
"""

from __future__ import annotations

ALGORITHMS: dict[str, dict[str, str]] = {
    "all_reduce": {"naive": "naive", "ring": "ring", "tree": "tree", "butterfly": "butterfly",
                   "rabenseifner": "rabenseifner", "hierarchical": "hierarchical",
                   "hierarchical_2d": "hierarchical_2d"},
    # recursive doubling is the butterfly's exchange pattern, and recursive halving is the first
    # half of Rabenseifner's all-reduce (Thakur, Rabenseifner & Gropp 2005): one file each.
    "all_gather": {"ring": "ring", "recursive_doubling": "butterfly", "naive": "naive"},
    "reduce_scatter": {"ring": "ring", "recursive_halving": "rabenseifner", "naive": "naive"},
    "broadcast": {"naive": "naive", "tree": "tree", "scatter_allgather": "scatter_allgather"},
    "reduce": {"naive": "naive", "tree": "tree"},
    "gather": {"naive": "naive", "tree": "tree"},
    "scatter": {"naive": "naive", "tree": "tree"},
    "all_to_all": {"pairwise": "pairwise", "naive": "naive"},
}
"""collective -> {algorithm name: module}, the module under both `ringzero.comm.algorithms` and
`ringzero.plan.comm.volumes`."""

COLLECTIVES = tuple(ALGORITHMS)
NODE_AWARE = ("hierarchical", "hierarchical_2d")
"""The algorithms that cut the group into nodes of `ranks_per_node` ranks and treat the links
inside a node and between nodes differently."""
AUTO, TORCH = "auto", "torch"
SPECIAL = (AUTO, TORCH)
"""Accepted for every collective on top of its algorithms: "auto" picks the one predicted fastest,
"torch" runs the backend's own collective (`torch.distributed`)."""


def names(collective: str) -> tuple[str, ...]:
    """The algorithm names of `collective`, without "auto" and "torch"."""
    return tuple(ALGORITHMS[collective])


def fits(algorithm: str, n: int, ranks_per_node: int | None) -> bool:
    """Whether `algorithm` runs on `n` ranks of `ranks_per_node` per node: hierarchical_2d pairs
    the ranks of equal local index across nodes, so it needs full nodes; the others run anywhere."""
    k = min(ranks_per_node or n, n)
    return algorithm != "hierarchical_2d" or n % k == 0


def spans_nodes_ok(algorithm: str, n: int, ranks_per_node: int | None) -> bool:
    """Whether `algorithm` is worth weighing on `n` ranks of `ranks_per_node` per node: a node-aware
    algorithm only when the group spans nodes (on one node `hierarchical` is a tree and
    `hierarchical_2d` a ring), and only where it `fits`."""
    if algorithm not in NODE_AWARE:
        return True
    return (ranks_per_node or n) < n and fits(algorithm, n, ranks_per_node)


def for_collective(algorithm: str, collective: str) -> str:
    """The algorithm a strategy's `collective` runs when the run names `algorithm` (an all-reduce
    algorithm, "auto" or "torch"): the same name where `collective` has it, else its ring (or its
    first algorithm). A ZeRO step's reduce-scatter and all-gather follow the run's all-reduce choice."""
    if algorithm in SPECIAL or algorithm in names(collective):
        return algorithm
    return "ring" if "ring" in names(collective) else names(collective)[0]
