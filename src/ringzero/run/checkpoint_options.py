"""The checkpoint options of a run (`CheckpointConfig`), checked as it is built; what they point
at on disk is checked before any rank starts by `checkpoint.preflight`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.run.fields import FieldError
from ringzero.run.kind import RunKind


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    save_dir: str | None = None
    """Folder of checkpoints (`ringzero.checkpoint`); None: none are written."""
    save_every: int | None = None
    """Save after every this many steps (and after the last); None: after the last only."""
    keep: int | None = None
    """Complete checkpoints kept under save_dir (the newest); None: all."""
    async_save: bool = False
    """Write checkpoints on a background thread: the step waits only for the copy to host memory."""
    resume: str | None = None
    """A checkpoint (its folder, or a save_dir: its latest) to continue from, in any layout."""
    overwrite: bool = False
    """Start in a save_dir that holds another run's checkpoints, retiring those at or after this
    run's saves (without it such a run is refused: a run only removes its own lineage's)."""
    init_from: str | None = None
    """A consolidated safetensors file (`ringzero checkpoint consolidate`) to take the weights from."""

    def __post_init__(self) -> None:
        for name in ("save_dir", "resume", "init_from"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise FieldError(name, f"{name} must be a path, got {v!r}")
        for name in ("save_every", "keep"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise FieldError(name, f"{name} must be an integer >= 1, got {v!r}")
        for name in ("async_save", "overwrite"):
            if not isinstance(getattr(self, name), bool):
                raise FieldError(name, f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("save_every", "keep", "async_save", "overwrite"):
            if getattr(self, name) not in (None, False) and self.save_dir is None:
                raise FieldError(name, f"{name} needs save_dir (where the checkpoints go)")
        if self.resume is not None and self.init_from is not None:
            raise FieldError("init_from", "init_from and resume both set the weights; give one")


def check(cfg) -> None:
    """Raise a `FieldError` for a checkpoint option the run's strategy cannot take."""
    if cfg.kind is RunKind.PARAMETER_SERVER and cfg.checkpoint.init_from is not None:
        raise FieldError("init_from", "init_from is not available with strategy 'ps'; resume from a checkpoint instead")
