"""The scratch one call of a collective algorithm takes, per byte of the whole buffer, on the
busiest of n ranks: its receive buffers and the work copies it makes of the caller's tensors
(`comm.api.work`), read from the code of each algorithm (a naive all-reduce's root receives every
other rank's buffer in one step: n - 1; a ring's receives one chunk: 1/n). The backend's own
collectives (algorithm "torch") allocate inside gloo: theirs is measured (the growth of the
busiest rank's VmHWM over the cell's buffers, 64 MiB of float32 on 2 ranks, rounded up).
`ringzero bench comm` sizes its ranks' scratch arena and its memory check by it (`bench.comm_memory`).
"""

from __future__ import annotations

from typing import Callable

Rule = Callable[[int], float]
"""Bytes per byte of the whole buffer, on the busiest of n ranks."""


def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def _each(k: float) -> Rule:
    return lambda n: k


SCRATCH: dict[tuple[str, str], Rule] = {
    ("all_reduce", "naive"): lambda n: n - 1,          # the root receives the n - 1 others at once
    ("all_reduce", "ring"): lambda n: 1 / n,           # one chunk
    ("all_reduce", "tree"): lambda n: min(2, n - 1),   # two children's messages in flight
    ("all_reduce", "butterfly"): lambda n: 1,          # the partner's whole buffer
    ("all_reduce", "rabenseifner"): lambda n: 1 / 2 if _power_of_two(n) else 1,   # halving; a fold
    ("all_reduce", "hierarchical"): lambda n: min(2, n - 1),   # a tree inside and across nodes
    ("all_reduce", "hierarchical_2d"): lambda n: 1,
    ("reduce_scatter", "ring"): lambda n: 1 + 1 / n,   # the work copy of the input, one chunk
    ("reduce_scatter", "recursive_halving"): lambda n: 2,
    ("reduce_scatter", "naive"): lambda n: n,          # the work copy, and n - 1 at the root
    ("reduce", "naive"): lambda n: max(1, n - 1),      # the root as all-reduce's; others: a work copy
    ("reduce", "tree"): lambda n: min(2, n - 1),      # the root's two children, or a copy and one
    ("gather", "naive"): lambda n: 1, ("gather", "tree"): lambda n: 1,      # the work buffer
    ("scatter", "naive"): lambda n: 1, ("scatter", "tree"): lambda n: 1,
    ("all_to_all", "pairwise"): lambda n: 2, ("all_to_all", "naive"): lambda n: 2,   # send and receive
    **{("all_gather", a): _each(0) for a in ("ring", "recursive_doubling", "naive")},   # in place
    **{("broadcast", a): _each(0) for a in ("naive", "tree", "scatter_allgather")},
    # gloo's own (measured, see the module doc); a non-root reduce also copies its input
    **{(c, "torch"): _each(k) for c, k in (
        ("all_reduce", 0.5), ("broadcast", 0.5), ("reduce", 1), ("all_gather", 2), ("reduce_scatter", 3),
        ("gather", 2), ("scatter", 0.5), ("all_to_all", 3))},
}
"""One call's scratch on the busiest rank, per byte of the whole buffer (see the module doc)."""


def scratch(collective: str, algorithms, n: int) -> float:
    """The most scratch any of `algorithms` takes on n ranks ("auto": any of the collective's)."""
    own = [a for c, a in SCRATCH if c == collective and a != "torch"]
    names = [x for a in algorithms for x in (own if a == "auto" else [a])]
    return max((SCRATCH[collective, a](n) for a in names), default=0.0)
