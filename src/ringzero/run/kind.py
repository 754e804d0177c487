"""What kind of run a `--strategy` names, and which data-parallel sharding it runs, derived once.

A run is one rank alone ("single"), a grid of dp x tp x pp ranks whose dp groups run one of
`plan.strategies.sharding`'s strategies ("dp", "zero1", "zero2", "zero3"), or a parameter server's
workers and servers ("ps", whose workers keep whole replicas: DP's table). Code asks the kind and
the sharding's own questions (`shard_params`, `gathers_after_step`, ...) rather than comparing the
strategy's name.
"""

from __future__ import annotations

import enum

from ringzero.plan.strategies import sharding
from ringzero.plan.strategies.sharding import Strategy


class RunKind(enum.Enum):
    SINGLE = "single"
    """One rank, no process group."""
    GRID = "grid"
    """dp x tp x pp ranks, a `sharding` strategy over each dp group."""
    PARAMETER_SERVER = "ps"
    """Workers pushing gradients to servers that own key ranges (`parallel.ps`)."""


def kind_of(strategy: str) -> RunKind:
    return {"single": RunKind.SINGLE, "ps": RunKind.PARAMETER_SERVER}.get(strategy, RunKind.GRID)


def sharding_of(strategy: str) -> Strategy:
    """The `plan.strategies.sharding` table a run's gradients and states follow (DP's for one rank
    and for a parameter server's workers)."""
    return sharding.DP if kind_of(strategy) is not RunKind.GRID else sharding.strategy(strategy)
