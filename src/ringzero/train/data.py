"""Byte-level data: vocabulary 256, nothing to download.

The default corpus is the Python standard library's own source files of the running interpreter
(present on every machine), read in sorted path order up to `max_bytes`, so two ranks (or two runs)
build the same corpus. `--data PATH` takes text files or folders instead. The last `val_fraction`
of the bytes is the validation split.

Each step draws `global_batch` windows of s + 1 bytes at offsets from a generator seeded by
(seed, step), the same on every rank; data-parallel rank r takes windows [r·B/dp, (r+1)·B/dp), so
the ranks together see exactly the global batch a single process would (the parity tests rely on it).
"""

from __future__ import annotations

import os
import stat
import sysconfig
from pathlib import Path

DEFAULT_MAX_BYTES = 4 * 2**20


SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}


def stdlib_files():
    """The standard library's .py files in sorted path order (lazily: the walk stops when unused)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(folder) / name


KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
CHUNK = 2**20
"""Bytes read at a time: the corpus grows a chunk at a time, never past `max_bytes`."""


def _files(path: str) -> list[Path]:
    """`path` itself (a regular file) or the regular files under it. Anything else is refused
    without opening it: a FIFO or a device could block or never end."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise ValueError(f"data path {path!r} does not exist (give a text file or a folder of them)") from None
    except OSError as exc:
        raise ValueError(f"data path {path!r} cannot be read: {exc.strerror}") from None
    if stat.S_ISREG(mode):
        return [p]
    if stat.S_ISDIR(mode):
        files = sorted(f for f in p.rglob("*") if f.is_file())     # is_file: regular files only
        if files:
            return files
        raise ValueError(f"data folder {path!r} has no files")
    kind = next((what for test, what in KINDS if test(mode)), "not a regular file")
    raise ValueError(f"data path {path!r} is {kind}; give a regular text file or a folder of them")


def _read(files, max_bytes: int) -> bytearray:
    """The first `max_bytes` of `files` concatenated: each file is read a chunk at a time up to
    what is left, so a file far larger than `max_bytes` costs `max_bytes` of memory, not its size."""
    corpus = bytearray()
    for f in files:
        try:
            with open(f, "rb") as fh:
                while len(corpus) < max_bytes and (chunk := fh.read(min(CHUNK, max_bytes - len(corpus)))):
                    corpus += chunk
        except OSError as exc:
            raise ValueError(f"data file {str(f)!r} cannot be read: {exc.strerror}") from None
        if len(corpus) >= max_bytes:
            break
    if len(corpus) < 2:
        raise ValueError(f"the corpus has {len(corpus)} bytes; it needs at least 2")
    return corpus


def corpus_bytes(path: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> bytearray:
    """The corpus: `path`'s files, or the standard library's sources, up to `max_bytes` (a
    bytearray: writable, so `load_bytes` wraps it in a tensor without a copy)."""
    return _read(_files(path) if path else stdlib_files(), max_bytes)


def check(corpus_size: int, seq: int, val_fraction: float = 0.1) -> tuple[int, int]:
    """(train, validation) bytes of a corpus of `corpus_size`; ValueError unless each split holds a
    sequence of `seq` + 1 bytes."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(corpus_size * (1 - val_fraction))
    for name, size in (("train", cut), ("val", corpus_size - cut)):
        if size <= seq + 1:
            raise ValueError(f"the {name} split has {size} bytes, fewer than a sequence of {seq} + 1")
    return cut, corpus_size - cut


def load_bytes(path: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
    """The corpus as a uint8 tensor (see `corpus_bytes`)."""
    import torch
    return torch.frombuffer(corpus_bytes(path, max_bytes), dtype=torch.uint8)


class ByteData:
    """Train/validation splits of a byte corpus and the per-rank batches of every step."""

    def __init__(self, corpus, seq: int, val_fraction: float = 0.1, seed: int = 0) -> None:
        cut, _ = check(len(corpus), seq, val_fraction)
        self.splits = {"train": corpus[:cut], "val": corpus[cut:]}
        self.seq, self.seed = seq, seed

    def batch(self, split: str, step: int, global_batch: int, rank: int = 0, dp: int = 1):
        """This rank's (inputs, targets), each (global_batch/dp, seq) int64, for `step`."""
        if global_batch % dp:
            raise ValueError(f"global batch {global_batch} is not divisible by {dp} data-parallel ranks")
        import torch
        data = self.splits[split]
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 2 + (split == "val"))
        starts = torch.randint(0, len(data) - self.seq - 1, (global_batch,), generator=gen)
        per = global_batch // dp
        mine = starts[rank * per:(rank + 1) * per]
        windows = torch.stack([data[s:s + self.seq + 1] for s in mine.tolist()]).long()
        return windows[:, :-1], windows[:, 1:]
