"""Checking a checkpoint before anything of it is loaded: what the manifest names is what is on disk.

`verify(directory, manifest)` checks first that the manifest's pieces make up every tensor whole,
as loading does (`coverage.check`: the same check), then every file the manifest lists, in the
order a loader would trust them:

1. the file is a regular file inside the checkpoint folder: not a symbolic link (to anywhere: a
   link to another run's shard reads as that run's), not a FIFO or device, and its real path is
   in the folder;
2. its size, and with `deep` its CRC-32, are the manifest's (a shard copied in from another run
   with the same keys, or changed after it was written, differs; CRC-32 is enough against
   accident and mix-up, which is what a checkpoint meets, not against forgery);
3. its safetensors metadata names the manifest's run;
4. every piece's tensor is in it, with the manifest's dtype and the piece's number of elements (the
   header alone: a piece saved in bf16 under an fp32 entry would load as a silent cast);
5. with `deep`, every weight and optimizer state is finite (a NaN saved is a NaN trained on).

The headers cost nothing; `deep` reads every byte once. `ringzero train --resume` runs it deep
before any rank starts, `ringzero checkpoint inspect --verify` and `consolidate` too.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass

from ringzero.checkpoint.coverage import check as check_coverage
from ringzero.checkpoint.manifest import MANIFEST, CheckpointError, Manifest

CODES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
STATE_KINDS = ("param", "master", "exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Verified:
    files: int
    bytes: int
    tensors: int
    """Tensors read whole and found finite (0 unless deep)."""
    summed: bool
    """Whether the files' CRC-32s were checked (deep, and the manifest has them: format 2)."""


def regular_file(directory: str, name: str) -> str:
    """The path of `name` in `directory` when it is a regular file there (see the module doc, 1)."""
    path = os.path.join(directory, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a complete checkpoint: its manifest lists {name}, which is "
                              "missing") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{path} is a symbolic link: a checkpoint's files must be its own regular files")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path} is not a regular file")
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise CheckpointError(f"{path} is not inside {directory}")
    return path


def _pieces_by_file(m: Manifest) -> dict[str, list[tuple[str, str, int]]]:
    """File -> [(key, dtype, elements)] of the pieces the manifest reads from it."""
    out: dict[str, list[tuple[str, str, int]]] = {name: [] for name in m.files()}
    for e in m.tensors.values():
        for p in e.pieces:
            out[p.file].append((p.key, e.dtype, p.numel()))
    return out


def _header(path: str, m: Manifest, pieces: list[tuple[str, str, int]]) -> None:
    from safetensors import safe_open
    try:
        with safe_open(path, framework="pt") as f:
            meta, keys = f.metadata() or {}, set(f.keys())
            for key, dtype, numel in pieces:
                if key not in keys:
                    raise CheckpointError(f"{path} has no tensor {key!r} that the manifest lists")
                sl = f.get_slice(key)
                got, count = sl.get_dtype(), math.prod(sl.get_shape())
                if got != CODES[dtype] or count != numel:
                    raise CheckpointError(f"{path}: tensor {key!r} is {got} x {count} in the file, "
                                          f"{CODES[dtype]} x {numel} in the manifest")
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - OSError, or safetensors' own error for a bad file
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    if m.run is not None and meta.get("run") != m.run:
        raise CheckpointError(f"{path} was written by run {meta.get('run')!r}, the manifest's run is {m.run!r}: "
                              "a shard of another run")


def _finite(path: str) -> int:
    """The weight and optimizer tensors of shard `path` checked finite; returns how many."""
    import torch
    from safetensors import safe_open
    count = 0
    with safe_open(path, framework="pt") as f:
        for key in f.keys():
            if key.partition("/")[0] not in STATE_KINDS:
                continue
            t = f.get_tensor(key)
            if not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise CheckpointError(f"{path}: tensor {key!r} holds {bad} NaN or infinite value"
                                      f"{'s' if bad > 1 else ''}: the run that saved it had diverged")
            count += 1
            del t
    return count


def _covered(directory: str, m: Manifest) -> None:
    """CheckpointError, naming the manifest, at the first tensor its pieces do not make up whole."""
    for name, entry in m.tensors.items():
        try:
            check_coverage(name, entry)
        except CheckpointError as exc:
            raise CheckpointError(f"{os.path.join(directory, MANIFEST)}: {exc}") from None


def verify(directory: str, m: Manifest, deep: bool = True) -> Verified:
    """CheckpointError naming the first tensor that manifest `m`'s pieces leave incomplete, or the
    first file of `directory` that is not what `m` says."""
    from ringzero.checkpoint.folders import crc32
    _covered(directory, m)
    total = tensors = 0
    for name, pieces in _pieces_by_file(m).items():
        path = regular_file(directory, name)
        size = os.path.getsize(path)
        total += size
        want = m.sizes.get(name)
        if want is not None and size != want["size"]:
            raise CheckpointError(f"{path} is {size} bytes, the manifest's is {want['size']}: not this checkpoint's file")
        _header(path, m, pieces)
        if deep and want is not None and crc32(path) != want["crc32"]:
            raise CheckpointError(f"{path}: its CRC-32 is not the manifest's: the file changed after it was saved")
        if deep:
            tensors += _finite(path)
    return Verified(files=len(m.files()), bytes=total, tensors=tensors, summed=deep and bool(m.sizes))
