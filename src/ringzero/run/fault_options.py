"""The fault options of a run (`FaultConfig`): non-finite steps tolerated in a row, injected faults
(an inf in a rank's gradient, a killed rank, a straggling worker) and restarts from the latest
checkpoint; checked as it is built and, where they need the rest of the run, by `check` (what they
do at run time: `train.nonfinite`, `train.checkpointing`, `train.straggler`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ringzero.run.fields import FieldError


@dataclass(frozen=True, kw_only=True)
class FaultConfig:
    straggler: tuple[int, float] | None = None
    """(rank, factor): that worker's compute takes factor times as long (a sleep of the difference)."""
    inject_nonfinite: tuple[int, int] | None = None
    """(rank, step): put an inf into that rank's gradient at that step (a fault, on purpose)."""
    inject_kill: tuple[int, int] | None = None
    """(rank, step): that rank SIGKILLs itself as that step begins (a fault; a restart runs without it)."""
    max_restarts: int = 0
    """Restart the whole job from the latest checkpoint under save_dir when a rank fails, at most this
    many times (torchrun's elastic agent does the same)."""
    max_nonfinite: int = 3
    """Stop after this many steps in a row whose gradients were not finite (bf16, fp32; fp16 backs
    its loss scale off instead)."""

    def __post_init__(self) -> None:
        m = self.max_nonfinite
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise FieldError("max_nonfinite", f"max_nonfinite must be an integer >= 1, got {m!r}")
        for name in ("inject_nonfinite", "inject_kill"):
            inj = getattr(self, name)
            if inj is not None and not (len(inj) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                              and v >= 0 for v in inj)):
                raise FieldError(name, f"{name} must be (rank >= 0, step >= 0), got {inj!r}")
        r = self.max_restarts
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise FieldError("max_restarts", f"max_restarts must be an integer >= 0, got {r!r}")
        s = self.straggler
        if s is not None and not (len(s) == 2 and isinstance(s[0], int) and not isinstance(s[0], bool)
                                  and s[0] >= 0 and math.isfinite(s[1]) and s[1] >= 1):
            raise FieldError("straggler", f"straggler must be (rank >= 0, factor >= 1), got {s!r}")


def check(cfg) -> None:
    """Raise a `FieldError` for an injected step outside the run or a restart without checkpoints."""
    f, steps = cfg.faults, cfg.training.steps
    for name in ("inject_nonfinite", "inject_kill"):
        inj = getattr(f, name)
        if inj is not None and inj[1] >= steps:
            raise FieldError(name, f"{name}'s step {inj[1]} is not one of the {steps} steps (0-{steps - 1})")
    if f.max_restarts and cfg.checkpoint.save_dir is None:
        raise FieldError("max_restarts", "max_restarts restarts from the latest checkpoint: it needs save_dir")
