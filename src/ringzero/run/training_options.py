"""The training loop of a run: its steps and batches, evaluation, data and logging, and what
backward recomputes."""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.config import RECOMPUTES
from ringzero.run.fields import check, choice


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    steps: int = 100
    """Optimizer steps the run takes (a resumed run's count includes the checkpoint's)."""
    micro_batch: int = 8
    """Sequences per rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (communication only on the last, for dp and zero1)."""
    recompute: str = "none"
    """Activation recomputation: none, selective (the attention core) or full (every block)."""
    eval_every: int = 25
    """Steps between validation losses (and one after the last step)."""
    eval_batches: int = 4
    """Batches each validation loss averages (micro_batch sequences per dp rank each), from the
    held-out tenth of the data."""
    seed: int = 0
    """Seed of the weights' initialisation, the batches drawn and the compression's random state."""
    data: str | None = None
    """Text file or folder; None: the Python standard library's sources."""
    max_bytes: int = 4 * 2**20
    """Bytes of the data read as the corpus (its first ones, in sorted path order; the model reads bytes)."""
    log_every: int | None = None
    """Print a plain log line every N steps; None: every 10 % of the run when stdout is not a terminal."""

    def __post_init__(self) -> None:
        choice(self, "recompute", RECOMPUTES)
        for name in ("steps", "micro_batch", "grad_accum", "eval_every", "eval_batches", "max_bytes"):
            check(self, name, lambda v: v >= 1, "must be >= 1", integer=True)
        check(self, "log_every", lambda v: v >= 1, "must be >= 1", integer=True, optional=True)
