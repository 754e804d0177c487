"""Which algorithms implement which collective, by name (the `algorithm=` keyword).

"auto" (pick by the calibrated α-β-γ model, `ringzero.comm.select`) and "torch" (the backend's own
collective) are accepted for every collective on top of the names below.
"""

from __future__ import annotations

import importlib

# collective -> {algorithm name: "module:function"} (modules under ringzero.comm.algorithms)
TABLE: dict[str, dict[str, str]] = {
    "all_reduce": {
        "naive": "naive:all_reduce", "ring": "ring:all_reduce", "tree": "tree:all_reduce",
        "butterfly": "butterfly:all_reduce", "rabenseifner": "rabenseifner:all_reduce",
        "hierarchical": "hierarchical:all_reduce",
    },
    "all_gather": {
        "ring": "ring:all_gather", "recursive_doubling": "butterfly:all_gather", "naive": "naive:all_gather",
    },
    "reduce_scatter": {
        "ring": "ring:reduce_scatter", "recursive_halving": "rabenseifner:reduce_scatter",
        "naive": "naive:reduce_scatter",
    },
    "broadcast": {
        "naive": "naive:broadcast", "tree": "tree:broadcast", "scatter_allgather": "scatter_allgather:broadcast",
    },
    "reduce": {"naive": "naive:reduce", "tree": "tree:reduce"},
    "gather": {"naive": "naive:gather", "tree": "tree:gather"},
    "scatter": {"naive": "naive:scatter", "tree": "tree:scatter"},
    "all_to_all": {"pairwise": "pairwise:all_to_all", "naive": "naive:all_to_all"},
}

COLLECTIVES = tuple(TABLE)
SPECIAL = ("auto", "torch")


def algorithms(collective: str) -> tuple[str, ...]:
    """The algorithm names of `collective` (without "auto"/"torch")."""
    return tuple(TABLE[collective])


def check_name(collective: str, algorithm: str) -> None:
    if collective not in TABLE:
        raise ValueError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if algorithm not in TABLE[collective] and algorithm not in SPECIAL:
        valid = ", ".join(SPECIAL + algorithms(collective))
        raise ValueError(f"unknown algorithm {algorithm!r} for {collective}; valid: {valid}")


def resolve(collective: str, algorithm: str):
    """The function implementing `algorithm` for `collective`."""
    check_name(collective, algorithm)
    module, func = TABLE[collective][algorithm].split(":")
    return getattr(importlib.import_module(f"ringzero.comm.algorithms.{module}"), func)
