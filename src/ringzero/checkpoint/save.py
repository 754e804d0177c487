"""Writing a checkpoint atomically: every rank its shard, rank 0 the manifest, then the rename.

    root/
      step-00000040/      manifest.json, rank-00000.safetensors, rank-00001.safetensors, ...
      step-00000080/
      latest              "step-00000080": the newest complete checkpoint

A save never needs a collective, so it can run beside training (`--async-save`):

1. `snapshot`: this rank's pieces (`state.pieces`) and RNG states, copied to host memory when the
   save is asynchronous (the only part the training step waits for);
2. `write`: every rank writes `rank-RRRRR.safetensors` into `step-NNNNNNNN.tmp-TOKEN/` (the run's
   id in its metadata) and fsyncs it, then writes `rank-RRRRR.json`, the list of what it wrote with
   the file's size and CRC-32, fsynced: its marker. TOKEN is the run's id (chosen by rank 0 when
   the run starts), so files a dead earlier attempt left in a directory of the same step are never
   mixed in;
3. rank 0 waits for every rank's marker, writes `manifest.json` from them, fsyncs it and the
   directory, renames the directory to `step-NNNNNNNN/`, fsyncs the root, then replaces `latest`
   (a file written beside it, fsynced, renamed over it); only then is the checkpoint there. It
   removes its lineage's temporary directories of this step and earlier ones (saves that died)
   and its lineage's complete checkpoints beyond the newest `keep`. A complete checkpoint is
   removed by renaming it to a temporary name first, so that a crash never leaves one
   half-deleted under its own name; those of this step or later (of the run this one resumed
   before them) go before the rename, so that the newest complete checkpoint is always the
   latest save.

A run only ever removes what its own lineage wrote (itself and the runs it resumed from, by the
manifests' run ids), as DeepSpeed and Megatron-LM never delete what they did not write; a run
started into a folder of another run's checkpoints is refused before its ranks start
(`run.checkpoint_options`) unless it was told to overwrite them (`overwrite`: then another
run's checkpoints at or after its saves are retired too, so that none shadows its newest).

A crash at any point leaves the previous checkpoints and `latest` as they were: a directory is
complete exactly when its name has no `.tmp` and it holds a manifest (`manifest.read`). Markers
and the rename need one file system that every rank sees (as every multi-node checkpoint does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass

import torch

from ringzero import outputs
from ringzero.checkpoint.folders import LATEST, STEP_DIR, TMP_DIR, complete, run_of, step_dir, summed
from ringzero.checkpoint.manifest import MANIFEST, Entry, Manifest, Piece, TPSlice
from ringzero.checkpoint.state import Local

def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _key(l: Local) -> str:
    return f"{l.name}|{l.tp.index if l.tp is not None else '-'}|{l.flat[0]}"


@dataclass
class Snapshot:
    """What one rank saves of one step: tensors by key, the manifest rows for them, and the
    manifest's fields (`meta`: layout, config, scaler, optimizer_step)."""

    step: int
    rank: int
    world: int
    tensors: dict[str, torch.Tensor]
    rows: list[dict]
    meta: dict
    token: str
    """The run's id."""
    keep: int | None
    ancestors: tuple[str, ...] = ()
    """The runs this one resumed from, oldest first (its lineage without itself)."""
    overwrite: bool = False
    """Retire another run's checkpoints at or after this save too (see the module doc)."""

    @property
    def lineage(self) -> tuple[str, ...]:
        return (*self.ancestors, self.token)


def snapshot(step: int, rank: int, world: int, locals_: list[Local], rng: dict[str, torch.Tensor], meta: dict,
             token: str, keep: int | None, copy: bool, ancestors: tuple[str, ...] = (),
             overwrite: bool = False) -> Snapshot:
    """This rank's save of `step`; `copy`: take the tensors' values now (an asynchronous save: the
    step goes on changing the originals), else keep views (written before training goes on)."""
    take = (lambda t: t.detach().clone()) if copy else (lambda t: t.detach().contiguous())
    tensors = {_key(l): take(l.tensor) for l in locals_}
    tensors.update({f"rng/{k}": v.clone() for k, v in rng.items()})
    rows = [{"name": l.name, "shape": list(l.shape), "dtype": str(l.tensor.dtype).removeprefix("torch."),
             "key": _key(l), "flat": list(l.flat), "tp": None if l.tp is None else dataclasses.asdict(l.tp)}
            for l in locals_]
    return Snapshot(step, rank, world, tensors, rows, meta, token, keep, tuple(ancestors), overwrite)


def tmp_dir(root: str, step: int, token: str) -> str:
    return os.path.join(root, f"{step_dir(step)}.tmp-{token}")


def write(root: str, snap: Snapshot, wait_s: float | None = 600.0) -> str | None:
    """Steps 2-3 of the module doc for `snap`; returns the checkpoint's path on rank 0. A rank that
    cannot write its shard leaves a `.failed` marker with its error, so that rank 0 reports it
    instead of waiting for a marker that never comes; `wait_s` None: wait as long as it takes (the
    ranks reach the step at their own pace, and a dead one ends the job)."""
    from safetensors.torch import save_file
    tmp = tmp_dir(root, snap.step, snap.token)
    try:
        os.makedirs(tmp, exist_ok=True)
        shard = os.path.join(tmp, rank_file(snap.rank))
        save_file(snap.tensors, shard, metadata={"run": snap.token, "step": str(snap.step), "rank": str(snap.rank)})
        record = synced_and_summed(shard)
        outputs.write_text(os.path.join(tmp, marker(snap.rank)), json.dumps({"rows": snap.rows, "file": record}))
    except Exception as exc:
        with contextlib.suppress(OSError):
            outputs.write_text(os.path.join(tmp, marker(snap.rank) + ".failed"), f"{type(exc).__name__}: {exc}")
        raise
    if snap.rank != 0:
        return None
    written = [(r, _wait_marker(tmp, r, wait_s)) for r in range(snap.world)]
    return publish(root, snap, build_manifest(snap.step, written=written, lineage=snap.lineage, **snap.meta))


def synced_and_summed(path: str) -> dict:
    """fsync file `path` and return its size and CRC-32 (`folders.summed`), the sum read back from
    the page cache on a thread while the disk takes the data: zlib releases the GIL, and the fsync
    waits on the disk, so the sum costs the write little (`benchmarks/bench_checksum.py`)."""
    box: dict = {}

    def run() -> None:
        try:
            box["record"] = summed(path)
        except BaseException as exc:  # noqa: BLE001 - raised below, on the writing thread
            box["error"] = exc
    summer = threading.Thread(target=run, name="ringzero-crc32", daemon=True)
    summer.start()
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    summer.join()
    if "error" in box:
        raise box["error"]
    return box["record"]


def marker(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def _wait_marker(tmp: str, rank: int, wait_s: float | None) -> dict:
    path = os.path.join(tmp, marker(rank))
    deadline = time.monotonic() + (wait_s if wait_s is not None else float("inf"))
    while not os.path.isfile(path):
        if os.path.isfile(path + ".failed"):
            with open(path + ".failed", encoding="utf-8") as f:
                raise OSError(f"checkpoint {tmp}: rank {rank} could not write its shard: {f.read()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"checkpoint {tmp}: rank {rank} did not finish writing its shard within {wait_s:g} s")
        time.sleep(0.01)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def build_manifest(step: int, layout: dict, config: dict, scaler: dict, optimizer_step: int,
                   written: list[tuple[int, dict]], lineage: tuple[str, ...]) -> Manifest:
    """The manifest of the pieces `written` [(rank, its marker)] by the last run of `lineage`."""
    tensors: dict[str, Entry] = {}
    rng, sizes = {}, {}
    for rank, mark in written:
        rng[str(rank)] = rank_file(rank)
        sizes[rank_file(rank)] = mark["file"]
        for r in mark["rows"]:
            e = tensors.setdefault(r["name"], Entry(tuple(r["shape"]), r["dtype"]))
            tp = None if r["tp"] is None else TPSlice(**{**r["tp"], "shape": tuple(r["tp"]["shape"])})
            e.pieces.append(Piece(file=rank_file(rank), key=r["key"], flat=tuple(r["flat"]), tp=tp))
    return Manifest(step=step, layout=layout, config=config, tensors=dict(sorted(tensors.items())),
                    scaler=scaler, rng=rng, optimizer_step=optimizer_step, run=lineage[-1], lineage=list(lineage),
                    sizes=sizes)


def publish(root: str, snap: Snapshot, manifest: Manifest) -> str:
    """Rank 0, once every shard is on disk: the manifest, the rename, `latest`, the clean-up of what
    this run's lineage wrote (see the module doc)."""
    tmp = tmp_dir(root, snap.step, snap.token)
    outputs.write_text(os.path.join(tmp, MANIFEST), manifest.to_json())
    fsync_dir(tmp)
    ours = {n for n in complete(root) if run_of(root, n) in snap.lineage}
    # Checkpoints of this step or later belong to a run this one was resumed before: retired first,
    # so that the newest complete checkpoint is always this run's.
    for name in complete(root):
        if int(STEP_DIR.match(name).group(1)) >= snap.step and (name in ours or snap.overwrite):
            retire(root, name)
    final = os.path.join(root, step_dir(snap.step))
    if os.path.exists(final):
        raise FileExistsError(f"checkpoint {final} was written by another run (id {run_of(root, step_dir(snap.step))}); "
                              "this run's save of that step is left in " + tmp)
    os.rename(tmp, final)
    fsync_dir(root)
    outputs.write_text(os.path.join(root, LATEST), step_dir(snap.step) + "\n")
    fsync_dir(root)
    for name in os.listdir(root):                    # this lineage's saves of this step or earlier that died
        m = TMP_DIR.match(name)
        token = (m.group(2) or "").removeprefix("-") if m else ""
        if m and int(m.group(1)) <= snap.step and (token in snap.lineage or token.startswith("retired-")):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if snap.keep is not None:
        mine = [n for n in complete(root) if n in ours or n == step_dir(snap.step)]
        for name in mine[:-snap.keep]:
            retire(root, name)
    return final


def retire(root: str, name: str) -> None:
    """Remove complete checkpoint `name` without ever leaving it half-deleted under its own name:
    renamed to a temporary name first (never loaded), then removed."""
    gone = os.path.join(root, f"{name}.tmp-retired-{secrets.token_hex(4)}")
    os.rename(os.path.join(root, name), gone)
    fsync_dir(root)
    shutil.rmtree(gone, ignore_errors=True)
