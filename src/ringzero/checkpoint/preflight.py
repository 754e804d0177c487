"""What a run's checkpoint paths point at, checked before any rank starts so that bad input writes
nothing (`preflight`): the save folder can be written and overlaps no other path of the run, nor
holds another run's checkpoints; the resumed checkpoint is this model's, complete and intact
(`checkpoint.verify`); the weights file is this model's. A resume that changes the run is named
(`changes`)."""

from __future__ import annotations

import dataclasses
import os

from safetensors import safe_open

from ringzero.checkpoint.folders import STEP_DIR, foreign, resolve
from ringzero.checkpoint.manifest import read
from ringzero.checkpoint.verify import verify
from ringzero.outputs import writable
from ringzero.plan.model.presets import MODELS
from ringzero.plan.model.presets import model as preset
from ringzero.run.gpt_shape import parameter_shapes
from ringzero.run.ps_options import workers


def preflight(cfg, world: int | None = None) -> list[str]:
    """A one-line ValueError when the run's checkpoint paths cannot be used (nothing is written
    before it): save_dir must be a folder this process can write in, or one it can make, and no
    other path of the run; resume must hold a complete checkpoint of this model, every shard of
    it as the manifest says (`checkpoint.verify`, deep); a save_dir holding another run's
    checkpoints is refused unless `overwrite` (a resumed run may keep those before its start);
    init_from must be a safetensors file of it. Returns the lines to tell the user: what a resume
    changes of the run it continues (`changes`)."""
    notes: list[str] = []
    lineage: tuple[str, ...] = ()
    if cfg.checkpoint.save_dir is not None:
        _writable_folder(cfg.checkpoint.save_dir)
        _apart(cfg)
    if cfg.checkpoint.resume is not None:
        directory = resolve(cfg.checkpoint.resume)
        m = read(directory)
        same_model(cfg, m.config, f"--resume {cfg.checkpoint.resume!r}")
        if m.step >= cfg.training.steps:
            raise ValueError(f"--resume {cfg.checkpoint.resume!r} is at step {m.step}, not before --steps {cfg.training.steps}: "
                             "nothing is left to run")
        verify(directory, m, deep=True)
        lineage = tuple(m.lineage)
        notes += changes(cfg, m, world, directory)
    if cfg.checkpoint.save_dir is not None and os.path.isdir(cfg.checkpoint.save_dir) and not cfg.checkpoint.overwrite:
        start = m.step if cfg.checkpoint.resume is not None else -1
        others = [n for n in foreign(cfg.checkpoint.save_dir, lineage) if int(STEP_DIR.match(n).group(1)) > start]
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise ValueError(f"--save-dir {cfg.checkpoint.save_dir!r} holds checkpoints of another run ({shown}) "
                             f"{'after the resumed step ' + str(start) if start >= 0 else ''}".rstrip()
                             + "; a run never removes what it did not write: give another --save-dir, "
                             "--resume one of them, or --overwrite")
    if cfg.checkpoint.init_from is not None:
        check_weights_file(cfg, cfg.checkpoint.init_from)
    return notes


def _writable_folder(path: str) -> None:
    """ValueError unless `path` is a folder this process can write in, or can be made as one: tried
    for real (`os.access` says yes for root on /proc)."""
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        what = "a file" if os.path.isfile(full) else "not a folder"
        raise ValueError(f"--save-dir {path!r} is {what}; give a folder")
    parent = os.path.dirname(full)
    if not os.path.isdir(full) and not os.path.isdir(parent):
        raise ValueError(f"--save-dir {path!r}: folder {parent!r} does not exist")
    writable(full if os.path.isdir(full) else parent, f"--save-dir {path!r}")


def _apart(cfg) -> None:
    """ValueError when save_dir is, holds or lies in another path of the run (the swap files, the
    data): a save must not overwrite what the run reads."""
    mine = os.path.realpath(cfg.checkpoint.save_dir)
    for flag, other in (("--nvme-path", cfg.zero.nvme_path), ("--data", cfg.training.data), ("--init-from", cfg.checkpoint.init_from)):
        if other is None:
            continue
        theirs = os.path.realpath(other)
        if mine == theirs or theirs.startswith(mine + os.sep) or mine.startswith(theirs + os.sep):
            raise ValueError(f"--save-dir {cfg.checkpoint.save_dir!r} and {flag} {other!r} overlap: the checkpoints would "
                             f"{'mix with' if flag == '--nvme-path' else 'overwrite'} what the run reads; "
                             "give them separate folders")


def changes(cfg, m, world: int | None, directory: str) -> list[str]:
    """One line naming what a resume changes of the run that saved checkpoint `m` and what it
    means ([] when nothing: the resumed run is then the unbroken one, bit for bit)."""
    saved, what = m.config, []
    dp = m.layout.get("dp")
    if world is not None and isinstance(dp, int) and all(k in saved for k in ("micro_batch", "grad_accum")):
        before = saved["micro_batch"] * saved["grad_accum"] * dp
        now = cfg.global_batch(workers(cfg, world))
        if before != now:
            what.append(f"global batch {before} -> {now} (the batches after it hold other sequences)")
    meaning = {"steps": "the learning-rate schedule ends elsewhere", "lr": "another learning-rate schedule",
               "warmup": "another learning-rate schedule", "lr_schedule": "another learning-rate schedule",
               "data": "another corpus", "max_bytes": "another corpus", "seed": "another data order and dropout"}
    now = cfg.flat()
    for name, why in meaning.items():
        if name in saved and saved[name] != now[name]:
            what.append(f"{name} {saved[name]!r} -> {now[name]!r} ({why})")
    if not what:
        return []
    return [f"ringzero: resuming {directory} at step {m.step} with {'; '.join(what)}: the run from here differs "
            "from the unbroken run's"]


def check_weights_file(cfg, path: str) -> None:
    """ValueError unless `path` is a safetensors file with every weight of `cfg`'s model, in its
    shape (`run.gpt_shape.parameter_shapes`: the header is read, no tensor)."""
    if not os.path.isfile(path):
        raise ValueError(f"--init-from {path!r} is not a file")
    try:
        with safe_open(path, framework="numpy") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors' own error for a file that is not one
        raise ValueError(f"--init-from {path!r} is not a safetensors file: {exc}") from None
    for name, shape in parameter_shapes(cfg.shape).items():
        if shapes.get(name) != shape:
            got = "missing" if name not in shapes else f"{list(shapes[name])}"
            raise ValueError(f"--init-from {path!r} is not a file of this model: {name!r} is {got}, the model's "
                             f"is {list(shape)}")


def same_model(cfg, saved: dict, what: str) -> None:
    """ValueError unless the checkpoint's run (`saved`, its TrainConfig as a dict) trained the same
    model as `cfg`: the shape its preset and overrides give (a field left to the preset is named
    by its value, not as None)."""
    if saved.get("model") not in MODELS:
        raise ValueError(f"{what} is a checkpoint of model {saved.get('model')!r}, this run's is {cfg.model.name!r}")
    base = preset(saved["model"])
    theirs = dataclasses.replace(base, **{k: saved[k] for k in ("seq", "layers") if saved.get(k) is not None})
    mine = cfg.shape
    for name in ("layers", "seq", "hidden", "heads", "vocab"):
        a, b = getattr(theirs, name, None), getattr(mine, name, None)
        if a != b:
            models = f" (model {saved['model']} against {cfg.model.name})" if saved["model"] != cfg.model.name else ""
            raise ValueError(f"{what} is a checkpoint of another model: its {name} is {a}, this run's {b}{models}")
