"""The folders of a save_dir, and what a manifest records of each file: torch-free, so that the
command line checks a checkpoint path before torch is imported.

    root/
      step-00000040/             a complete checkpoint: no `.tmp` in its name, and a manifest
      step-00000080.tmp-TOKEN/   a save in progress, or one that died (TOKEN: its run's id)
      latest                     "step-00000040": the newest complete checkpoint, for people and tools

`ringzero train` alone writes these. `claimed` tells whether a path another output would write is
part of them: a checkpoint (a folder whose manifest.json is a ringzero manifest) or anything in
one, a save folder (one whose `latest` names a step-NNNNNNNN, or that holds a step-NNNNNNNN/ or
step-NNNNNNNN.tmp-*/ folder) itself, or the names `latest`, step-NNNNNNNN and step-NNNNNNNN.tmp-*
in a save folder. Other names in a save folder are free: a consolidated model may sit beside its
checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import zlib

from ringzero.checkpoint.manifest import FORMATS, MANIFEST, CheckpointError, read

LATEST = "latest"
STEP_DIR = re.compile(r"^step-(\d{8})$")
TMP_DIR = re.compile(r"^step-(\d{8})\.tmp(-.*)?$")


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def complete(root: str) -> list[str]:
    """The complete checkpoint directories under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if STEP_DIR.match(n) and os.path.isfile(os.path.join(root, n, MANIFEST))]
    return sorted(names)


def resolve(path: str) -> str:
    """The checkpoint directory `path` names: itself when it holds a manifest, else the newest
    complete checkpoint under it (a save that died after its rename but before `latest` was
    replaced still counts: `latest` is for people and tools). CheckpointError when there is none."""
    if os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} is a file; give a checkpoint folder or a --save-dir")
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    found = complete(path)
    if not found:
        raise CheckpointError(f"{path!r} holds no complete checkpoint (no step-NNNNNNNN/ with a manifest)")
    return os.path.join(path, found[-1])


def _checkpoint(folder: str) -> bool:
    """Whether `folder` holds a ringzero manifest (one that is not valid still makes it a checkpoint's)."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError, RecursionError):
        return os.path.basename(folder).startswith("step-")
    return isinstance(d, dict) and d.get("format") in FORMATS


def _save_folder(folder: str, save_dirs: tuple[str, ...]) -> str | None:
    """What makes `folder` a save folder, in words (None: it is not one)."""
    if folder in save_dirs:
        return "this run's --save-dir"
    try:
        with open(os.path.join(folder, LATEST), encoding="utf-8") as f:
            if STEP_DIR.match(f.read(64).strip()):
                return f"it holds {LATEST}"
    except (OSError, ValueError):
        pass
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    steps = (n for n in names if (STEP_DIR.match(n) or TMP_DIR.match(n)) and os.path.isdir(os.path.join(folder, n)))
    step = next(steps, None)
    return f"it holds {step}/" if step else None


def claimed(path: str, save_dirs: tuple[str, ...] = ()) -> str | None:
    """How output `path` would write into what `ringzero train` keeps (see the module doc), in
    words ("is checkpoint 'ck/step-00000003'"); None when it would not. `save_dirs`: folders that are
    save folders though they may not hold one yet (the run's own --save-dir)."""
    full = os.path.realpath(path)
    mine = tuple(os.path.realpath(d) for d in save_dirs)
    if what := _save_folder(full, mine):
        return f"is save folder {full!r} ({what})"
    here = full
    while True:
        parent, name = os.path.split(here)
        role = "is" if here == full else "is inside"
        if os.path.isdir(here) and _checkpoint(here):
            return f"{role} checkpoint {here!r}"
        if (name == LATEST or STEP_DIR.match(name) or TMP_DIR.match(name)) and _save_folder(parent, mine):
            what = "its pointer to the newest checkpoint" if name == LATEST else "a checkpoint's name"
            return f"{role} {name!r} of save folder {parent!r} ({what})"
        if parent == here:
            return None
        here = parent


def not_claimed(path: str, flag: str, save_dirs: tuple[str, ...] = ()) -> None:
    """A one-line ValueError when output `path` of `flag` would write into a checkpoint or over a
    save folder's own names (`claimed`)."""
    why = claimed(path, save_dirs)
    if why:
        raise ValueError(f"{flag} {path!r} {why}: only ringzero train writes there; give a path outside "
                         "checkpoints and save folders (another name beside them is fine)")


def run_of(root: str, name: str) -> str | None:
    """The id of the run that wrote complete checkpoint `name` under `root` (None: format 1, or a
    manifest that cannot be read: never taken for this run's)."""
    try:
        return read(os.path.join(root, name)).run
    except CheckpointError:
        return None


def foreign(root: str, lineage: tuple[str, ...]) -> list[str]:
    """The complete checkpoints under `root` that no run of `lineage` wrote, oldest first."""
    return [n for n in complete(root) if run_of(root, n) not in lineage]


def crc32(path: str, chunk: int = 8 << 20) -> str:
    """The CRC-32 of file `path` as 8 hex digits: zlib's runs at ~2 GB/s, about 10x the rate a
    shard is written and fsynced at (`python benchmarks/bench_checksum.py`), and reads the file
    back from the page cache."""
    value = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            value = zlib.crc32(block, value)
    return f"{value:08x}"


def summed(path: str) -> dict:
    """The manifest's record of file `path`: its size and CRC-32."""
    return {"size": os.path.getsize(path), "crc32": crc32(path)}
