"""The checkpoint options of a run, checked as `TrainConfig` is built (`check`); what they point at
on disk is checked before any rank starts by `checkpoint.preflight`.
"""

from __future__ import annotations

from ringzero.run.fields import FieldError
from ringzero.run.kind import RunKind


def _error(field: str, message: str) -> FieldError:
    return FieldError(field, message)


def _int(cfg, name: str) -> None:
    v = getattr(cfg, name)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise _error(name, f"{name} must be an integer >= 1, got {v!r}")


def check(cfg) -> None:
    """Raise a `FieldError` for the first checkpoint option `cfg` cannot take."""
    for name in ("save_dir", "resume", "init_from"):
        v = getattr(cfg, name)
        if v is not None and (not isinstance(v, str) or not v):
            raise _error(name, f"{name} must be a path, got {v!r}")
    _int(cfg, "save_every")
    _int(cfg, "keep")
    for name in ("async_save", "overwrite"):
        if not isinstance(getattr(cfg, name), bool):
            raise _error(name, f"{name} must be true or false, got {getattr(cfg, name)!r}")
    for name in ("save_every", "keep", "async_save", "overwrite"):
        if getattr(cfg, name) not in (None, False) and cfg.save_dir is None:
            raise _error(name, f"{name} needs save_dir (where the checkpoints go)")
    if cfg.resume is not None and cfg.init_from is not None:
        raise _error("init_from", "init_from and resume both set the weights; give one")
    if cfg.kind is RunKind.PARAMETER_SERVER and cfg.init_from is not None:
        raise _error("init_from", "init_from is not available with strategy 'ps'; resume from a checkpoint instead")
