"""The manifest of a checkpoint: what each global tensor is and which slice of it each file holds.

A checkpoint directory `step-00000120/` holds one safetensors file per writing rank and
`manifest.json`, written last. The manifest describes global tensors, never ranks' buffers (as
torch's Distributed Checkpoint does), so a checkpoint loads into any layout and world size:

    {"format": "ringzero.checkpoint/2", "step": 120, "layout": {...}, "config": {...},
     "run": "5f0c...", "lineage": ["a1b2...", "5f0c..."],
     "files": {"rank-00000.safetensors": {"size": 1234, "crc32": "9e83486d"}, ...},
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

`run` is the id of the run that wrote the checkpoint (also in every shard's safetensors metadata),
`lineage` the runs it descends from, oldest first, ending with itself: a run only ever retires
checkpoints of its own lineage. `files` gives each shard's size and CRC-32 (`checkpoint.verify`),
so that a shard copied from another run, or changed, is refused before it is loaded.

Loading reads only JSON and safetensors: no pickle. File names are plain names inside the
directory (no separators, no "..", nothing absolute), so a manifest cannot make the loader read
elsewhere. A JSON object with a key twice is refused (Python's json keeps the last, silently).
Format 1 (before run ids and checksums) still loads; its shards cannot be checked against a sum.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from ringzero.json_input import unique_keys

FORMAT = "ringzero.checkpoint/2"
FORMATS = ("ringzero.checkpoint/1", FORMAT)
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
    run: str | None = None
    """The id of the run that wrote it (None: format 1, before run ids)."""
    lineage: list[str] = field(default_factory=list)
    """The runs this checkpoint descends from, oldest first, ending with `run`."""
    sizes: dict[str, dict] = field(default_factory=dict)
    """File -> {"size": bytes, "crc32": 8 hex digits} (saved as "files")."""
    format: str = FORMAT

    def to_json(self) -> str:
        d = asdict(self)
        d["files"] = d.pop("sizes")
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


def _count(d: dict, key: str, default: int | None = None) -> int:
    """d[key] as a JSON integer >= 0 (7.5, true, "3" and -5 are refused)."""
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise CheckpointError(f"manifest {key!r} must be an integer >= 0, got {v!r}")
    return v


def _check_rng(m: Manifest) -> None:
    """Every rank of the saving layout wrote its RNG state: a resume in that layout restores them all."""
    world = m.layout.get("world")
    if isinstance(world, int) and not isinstance(world, bool) and m.rng:
        missing = sorted(set(range(world)) - {int(k) for k in m.rng if k.isdigit()}, key=int)
        extra = sorted(k for k in m.rng if not k.isdigit() or int(k) >= world)
        if missing or extra:
            what = f"rank {missing[0]}'s RNG state is missing" if missing else f"it lists RNG state {extra[0]!r}"
            raise CheckpointError(f"manifest of a {world}-rank layout: {what}")


def _file(name: str, d) -> dict:
    ok = (isinstance(d, dict) and isinstance(d.get("size"), int) and not isinstance(d["size"], bool)
          and d["size"] >= 0 and isinstance(d.get("crc32"), str) and len(d["crc32"]) == 8)
    if not ok:
        raise CheckpointError(f"manifest entry of file {name!r} must be {{\"size\": bytes, \"crc32\": 8 hex digits}}, "
                              f"got {d!r}")
    return {"size": d["size"], "crc32": d["crc32"]}


def parse(text: str) -> Manifest:
    """The manifest in `text` (CheckpointError when it is not one)."""
    try:
        d = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"manifest is not JSON: {exc}") from None
    except ValueError as exc:              # a key twice (`unique_keys`): which value is meant cannot be told
        raise CheckpointError(f"manifest {exc}: which value is meant cannot be told") from None
    except RecursionError:
        raise CheckpointError("manifest is nested too deeply to be one") from None
    if not isinstance(d, dict) or d.get("format") not in FORMATS:
        raise CheckpointError(f"not a ringzero checkpoint manifest (format {d.get('format') if isinstance(d, dict) else None!r}; "
                              f"expected {FORMAT!r})")
    try:
        tensors = {name: Entry(tuple(int(x) for x in e["shape"]), str(e["dtype"]), [_piece(p) for p in e["pieces"]])
                   for name, e in d["tensors"].items()}
        run, lineage = d.get("run"), d.get("lineage", [])
        if run is not None and not (isinstance(run, str) and isinstance(lineage, list) and lineage
                                    and all(isinstance(r, str) for r in lineage) and lineage[-1] == run):
            raise CheckpointError(f"manifest run {run!r} must be a string ending its lineage {lineage!r}")
        m = Manifest(step=_count(d, "step"), layout=dict(d["layout"]), config=dict(d["config"]), tensors=tensors,
                     scaler=dict(d.get("scaler", {})), rng={str(k): safe_name(v) for k, v in d.get("rng", {}).items()},
                     optimizer_step=_count(d, "optimizer_step", 0), run=run, lineage=list(lineage),
                     sizes={safe_name(k): _file(k, v) for k, v in d.get("files", {}).items()}, format=d["format"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"manifest is malformed: {type(exc).__name__}: {exc}") from None
    for name, e in m.tensors.items():
        _check_entry(name, e)
    _check_rng(m)
    if m.run is not None and set(m.sizes) != set(m.files()):
        odd = sorted(set(m.sizes) ^ set(m.files()))[0]
        raise CheckpointError(f"manifest's files and the files its tensors name differ at {odd!r}")
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
