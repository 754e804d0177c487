"""The checkpoint options of a run: `check` (fields, as `TrainConfig` is built) and `preflight` (the
file system: before any rank starts, so that bad input writes nothing).
"""

from __future__ import annotations

import os



def _error(field: str, message: str):
    from .config import FieldError
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
    if not isinstance(cfg.async_save, bool):
        raise _error("async_save", f"async_save must be true or false, got {cfg.async_save!r}")
    for name in ("save_every", "keep", "async_save"):
        if getattr(cfg, name) not in (None, False) and cfg.save_dir is None:
            raise _error(name, f"{name} needs save_dir (where the checkpoints go)")
    if cfg.resume is not None and cfg.init_from is not None:
        raise _error("init_from", "init_from and resume both set the weights; give one")
    if cfg.strategy == "ps" and cfg.init_from is not None:
        raise _error("init_from", "init_from is not available with strategy 'ps'; resume from a checkpoint instead")


def preflight(cfg) -> None:
    """A one-line ValueError when the run's checkpoint paths cannot be used: save_dir's parent must
    exist and be writable (save_dir itself is made); resume must hold a complete checkpoint of this
    model; init_from must be a safetensors file of it."""
    from ..checkpoint.load import resolve
    from ..checkpoint.manifest import read
    if cfg.save_dir is not None:
        full = os.path.abspath(cfg.save_dir)
        parent = os.path.dirname(full)
        if os.path.exists(full) and not os.path.isdir(full):
            raise ValueError(f"--save-dir {cfg.save_dir!r} is a file; give a folder")
        if not os.path.isdir(parent):
            raise ValueError(f"--save-dir {cfg.save_dir!r}: folder {parent!r} does not exist")
        target = full if os.path.isdir(full) else parent
        if not os.access(target, os.W_OK | os.X_OK):
            raise ValueError(f"--save-dir {cfg.save_dir!r}: cannot write in {target!r}")
    if cfg.resume is not None:
        m = read(resolve(cfg.resume))
        same_model(cfg, m.config, f"--resume {cfg.resume!r}")
        if m.step >= cfg.steps:
            raise ValueError(f"--resume {cfg.resume!r} is at step {m.step}, not before --steps {cfg.steps}: "
                             "nothing is left to run")
    if cfg.init_from is not None:
        check_weights_file(cfg, cfg.init_from)


def check_weights_file(cfg, path: str) -> None:
    """ValueError unless `path` is a safetensors file with every weight of `cfg`'s model, in its
    shape (the model is built on the meta device: no memory)."""
    import torch
    from safetensors import safe_open

    from .model import GPT
    if not os.path.isfile(path):
        raise ValueError(f"--init-from {path!r} is not a file")
    try:
        with safe_open(path, framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors' own error for a file that is not one
        raise ValueError(f"--init-from {path!r} is not a safetensors file: {exc}") from None
    with torch.device("meta"):
        model = GPT(cfg.shape, attention=cfg.attention, dropout=cfg.dropout)
    for name, p in model.named_parameters():
        if shapes.get(name) != tuple(p.shape):
            got = "missing" if name not in shapes else f"{list(shapes[name])}"
            raise ValueError(f"--init-from {path!r} is not a file of this model: {name!r} is {got}, the model's "
                             f"is {list(p.shape)}")


def same_model(cfg, saved: dict, what: str) -> None:
    """ValueError unless the checkpoint's run (`saved`, its TrainConfig as a dict) trained the same
    model as `cfg`: the preset and the shape fields that change its tensors."""
    for name in ("model", "layers", "seq"):
        if saved.get(name) != getattr(cfg, name):
            raise ValueError(f"{what} is a checkpoint of another model: its {name} is {saved.get(name)!r}, "
                             f"this run's {getattr(cfg, name)!r}")
