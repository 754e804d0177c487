"""Which function implements which collective algorithm, by name (the `algorithm=` keyword).

The names come from `ringzero.plan.comm.algorithms`; "auto" (pick by the calibrated α-β-γ model,
`ringzero.comm.select`) and "torch" (the backend's own collective) are accepted for every collective
on top of them.
"""

from __future__ import annotations

import importlib

# COLLECTIVES, SPECIAL and algorithms() are re-exported: the comm layer and its callers read them here.
from ringzero.plan.comm.algorithms import ALGORITHMS, COLLECTIVES, SPECIAL  # noqa: F401
from ringzero.plan.comm.algorithms import names as algorithms

TABLE: dict[str, dict[str, str]] = {c: {a: f"{m}:{c}" for a, m in algs.items()}
                                    for c, algs in ALGORITHMS.items()}
"""collective -> {algorithm name: "module:function"} under ringzero.comm.algorithms."""


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
