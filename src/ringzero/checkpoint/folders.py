"""The folders of a save_dir, and what a manifest records of each file: torch-free, so that the
command line checks a checkpoint path before torch is imported.

    root/
      step-00000040/             a complete checkpoint: no `.tmp` in its name, and a manifest
      step-00000080.tmp-TOKEN/   a save in progress, or one that died (TOKEN: its run's id)
      latest                     "step-00000040": the newest complete checkpoint, for people and tools
"""

from __future__ import annotations

import os
import re
import zlib

from ringzero.checkpoint.manifest import MANIFEST, CheckpointError, read

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
