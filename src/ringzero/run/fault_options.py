"""The fault options of a run: non-finite steps tolerated in a row, injected faults (an inf in a
rank's gradient, a killed rank) and restarts from the latest checkpoint; checked as `TrainConfig`
is built (what they do at run time: `train.nonfinite`, `train.checkpointing`)."""

from __future__ import annotations

from ringzero.run.fields import FieldError


def check(cfg) -> None:
    """Raise a `FieldError` for a bad `inject_nonfinite` or `max_nonfinite`."""
    m = cfg.max_nonfinite
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise FieldError("max_nonfinite", f"max_nonfinite must be an integer >= 1, got {m!r}")
    for name in ("inject_nonfinite", "inject_kill"):
        inj = getattr(cfg, name)
        if inj is not None and not (len(inj) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                          for v in inj)):
            raise FieldError(name, f"{name} must be (rank >= 0, step >= 0), got {inj!r}")
        if inj is not None and inj[1] >= cfg.steps:
            raise FieldError(name, f"{name}'s step {inj[1]} is not one of the {cfg.steps} steps (0-{cfg.steps - 1})")
    r = cfg.max_restarts
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        raise FieldError("max_restarts", f"max_restarts must be an integer >= 0, got {r!r}")
    if r and cfg.save_dir is None:
        raise FieldError("max_restarts", "max_restarts restarts from the latest checkpoint: it needs save_dir")
