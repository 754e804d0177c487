"""What a collective is for, and one step's collectives each with its purpose: the one table the
planner's schedules and the engine's call sites both read.

A step's bytes are split by purpose (data-parallel reduction, ZeRO's weight gathers, tensor
parallelism's, the pipeline's messages, ...) on a trace and in the run report's byte twins per kind.
The planner's schedules (`plan.strategies.sharding`, `zeropp`, `compression`, the tensor-parallel
and pipeline calls) give every `Call` the kind of the table entry it comes from, and the engine runs
that entry's collective under the same kind (`ringzero.comm.kinds`), so the two sides cannot name
one call differently: there is no second rule that guesses a call's kind from its collective or
its position in the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Kind:
    """One purpose of communication."""

    name: str
    label: str
    """How the report's byte twins name its row."""
    predicted: bool
    """Whether a training step's planner predicts its bytes (the others are bookkeeping: checks,
    probes, loss means; or another engine's: the parameter server)."""


GRADIENT = "dp"
WEIGHTS = "zero_gather"
TP = "tp"
SP = "sp"
PP = "pp"
EMBEDDING = "embedding"
NORM = "norm"
PS = "ps"
CHECK = "check"
LOSS = "loss"
PROBE = "probe"
OTHER = "other"

TABLE: dict[str, Kind] = {k.name: k for k in (
    Kind(GRADIENT, "data-parallel gradient reduction", True),      # all-reduce, ZeRO's reduce-scatter, a hook's calls, qgZ
    Kind(WEIGHTS, "ZeRO weight all-gathers", True),                # after ZeRO-1/2's step, ZeRO-3's per layer, hpZ's
    Kind(TP, "tensor-parallel collectives", True),                 # inside forward and backward
    Kind(SP, "sequence-parallel gradient sum", True),              # LayerNorm and bias gradients after backward
    Kind(PP, "pipeline sends", True),                              # stage-to-stage point-to-point
    Kind(EMBEDDING, "tied-embedding gradient sum", True),          # first and last stage
    Kind(NORM, "gradient-norm sums", True),                        # one fp32 per group
    Kind(PS, "parameter-server pushes and pulls", False),
    Kind(CHECK, "non-finite vote", False),
    Kind(LOSS, "loss and validation means", False),
    Kind(PROBE, "in-run rate probes", False),
    Kind(OTHER, "other (no kind given)", False),
)}
"""Every kind, in the report's order."""

KINDS = tuple(TABLE)


class Call(NamedTuple):
    """One collective of a step's schedule on one group: what it moves, how often, what it is for."""

    collective: str
    count: int
    """Elements per call."""
    itemsize: int
    """Bytes per element."""
    times: int
    """Calls per step."""
    kind: str
    """Its purpose (`TABLE`)."""
