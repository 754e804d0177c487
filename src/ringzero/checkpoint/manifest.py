"""The manifest of a checkpoint: what each global tensor is and which slice of it each file holds.

A checkpoint directory `step-00000120/` holds one safetensors file per writing rank and
`manifest.json`, written last. The manifest describes global tensors, never ranks' buffers (as
torch's Distributed Checkpoint does), so a checkpoint loads into any layout and world size:

    {"format": "ringzero.checkpoint/1", "step": 120, "layout": {...}, "config": {...},
     "scaler": {...}, "data": {"step": 120}, "rng": {"0": "rank-00000.safetensors", ...},
     "tensors": {"param/blocks.0.attn.qkv.weight": {"shape": [192, 64], "dtype": "float32",
                  "pieces": [{"file": "rank-00001.safetensors", "key": "...",
                              "tp": {"dim": 0, "stride": 3, "index": 1, "parts": 2, "shape": [96, 64]},
                              "flat": [0, 6144]}, ...]}, ...}}

A piece is a contiguous range `flat` [lo, hi) of one tensor-parallel slice of the tensor, flattened:
the slice `tp` (Megatron's layout: the tensor, padded along `dim` to parts × shape[dim], cut into
`stride` stacked blocks (q, k, v), each cut into `parts`; slice `index` is its part of every block,
of shape `shape`) or the whole tensor when `tp` is null. Names: "param/<name>" in the training
precision, and "exp_avg/", "exp_avg_sq/" and, for 16-bit training, "master/" in fp32.

Loading reads only JSON and safetensors: no pickle. File names are plain names inside the
directory (no separators, no "..", nothing absolute), so a manifest cannot make the loader read
elsewhere.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

FORMAT = "ringzero.checkpoint/1"
MANIFEST = "manifest.json"
DTYPES = ("float32", "bfloat16", "float16")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked: one line naming what is wrong."""


@dataclass(frozen=True)
class TPSlice:
    dim: int
    stride: int
    index: int
    parts: int
    shape: tuple[int, ...]
    """This slice's shape (the tensor-parallel rank's own tensor)."""


@dataclass(frozen=True)
class Piece:
    file: str
    key: str
    flat: tuple[int, int]
    """[lo, hi) of the slice (or whole tensor) flattened."""
    tp: TPSlice | None = None

    def numel(self) -> int:
        return self.flat[1] - self.flat[0]


@dataclass
class Entry:
    shape: tuple[int, ...]
    dtype: str
    pieces: list[Piece] = field(default_factory=list)

    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Manifest:
    step: int
    layout: dict
    config: dict
    tensors: dict[str, Entry]
    scaler: dict = field(default_factory=dict)
    rng: dict[str, str] = field(default_factory=dict)
    """Global rank -> the file holding its RNG states (restored when the layout is the same)."""
    optimizer_step: int = 0
    format: str = FORMAT

    def to_json(self) -> str:
        d = asdict(self)
        d["data"] = {"step": self.step}
        return json.dumps(d, indent=1, sort_keys=True)

    def files(self) -> list[str]:
        names = {p.file for e in self.tensors.values() for p in e.pieces} | set(self.rng.values())
        return sorted(names)


def safe_name(name: str) -> str:
    """`name` when it is a plain file name inside a directory; CheckpointError otherwise."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\x00" in name or os.path.isabs(name)):
        raise CheckpointError(f"manifest names a file outside its directory: {name!r}; allowed: plain file names")
    return name


def _piece(d: dict) -> Piece:
    tp = d.get("tp")
    return Piece(file=safe_name(d["file"]), key=str(d["key"]), flat=(int(d["flat"][0]), int(d["flat"][1])),
                 tp=None if tp is None else TPSlice(int(tp["dim"]), int(tp["stride"]), int(tp["index"]),
                                                    int(tp["parts"]), tuple(int(x) for x in tp["shape"])))


def _check_tp(name: str, tp: TPSlice, shape: tuple[int, ...]) -> None:
    """CheckpointError unless `tp` can be a slice of a tensor of `shape` (see `slices.tp_slice`)."""
    ok = (tp.stride >= 1 and tp.parts >= 1 and 0 <= tp.index < tp.parts and 0 <= tp.dim < len(shape)
          and len(tp.shape) == len(shape) and tp.parts * tp.shape[tp.dim] >= shape[tp.dim]
          and tp.shape[tp.dim] % tp.stride == 0
          and all(a == b for d, (a, b) in enumerate(zip(tp.shape, shape)) if d != tp.dim))
    if not ok:
        raise CheckpointError(f"tensor {name!r}: tensor-parallel slice {tp} cannot be cut from shape {list(shape)}")


def _check_entry(name: str, e: Entry) -> None:
    if e.dtype not in DTYPES:
        raise CheckpointError(f"tensor {name!r} has dtype {e.dtype!r}; allowed: {', '.join(DTYPES)}")
    if not e.pieces:
        raise CheckpointError(f"tensor {name!r} has no pieces")
    for p in e.pieces:
        if p.tp is not None:
            _check_tp(name, p.tp, e.shape)
        size = math.prod(p.tp.shape) if p.tp is not None else e.numel()
        if not 0 <= p.flat[0] < p.flat[1] <= size:
            raise CheckpointError(f"tensor {name!r}: piece {p.flat} is outside its slice of {size} elements")


def parse(text: str) -> Manifest:
    """The manifest in `text` (CheckpointError when it is not one)."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"manifest is not JSON: {exc}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise CheckpointError(f"not a ringzero checkpoint manifest (format {d.get('format') if isinstance(d, dict) else None!r}; "
                              f"expected {FORMAT!r})")
    try:
        tensors = {name: Entry(tuple(int(x) for x in e["shape"]), str(e["dtype"]), [_piece(p) for p in e["pieces"]])
                   for name, e in d["tensors"].items()}
        m = Manifest(step=int(d["step"]), layout=dict(d["layout"]), config=dict(d["config"]), tensors=tensors,
                     scaler=dict(d.get("scaler", {})), rng={str(k): safe_name(v) for k, v in d.get("rng", {}).items()},
                     optimizer_step=int(d.get("optimizer_step", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"manifest is malformed: {type(exc).__name__}: {exc}") from None
    for name, e in m.tensors.items():
        _check_entry(name, e)
    return m


def read(directory: str) -> Manifest:
    """The manifest of checkpoint `directory` (CheckpointError when it has none or a bad one)."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            return parse(f.read())
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a complete checkpoint: it has no {MANIFEST}") from None
    except CheckpointError as exc:              # name the file: the error alone does not say which
        raise CheckpointError(f"{path}: {exc}") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not UTF-8 text: not a checkpoint manifest") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
