"""Loading a checkpoint into any layout: global tensors assembled one at a time, then cut.

For each global tensor this rank holds a piece of (`state.pieces`), the loader reads the pieces the
manifest lists (safetensors, opened lazily, one tensor at a time), assembles the global tensor
(`slices.assemble`) and copies this rank's piece out of it (`slices.piece_of`): peak memory is one
global tensor beyond the rank's own state. No conversion step, whatever the saving layout was.

Precision: a 16-bit run saves "master/" (fp32) beside "param/"; the loader takes a weight from
"master/" when there is one (cast to the running precision: a 16-bit weight is its master rounded),
so an fp32 run resumes a bf16 checkpoint without loss and the other way round.
"""

from __future__ import annotations

import torch

from ringzero.checkpoint.manifest import CheckpointError, Manifest, Piece, read
from ringzero.checkpoint.slices import assemble, piece_of
from ringzero.checkpoint.state import Local


class Reader:
    """The pieces of checkpoint `directory`, read from its safetensors files. Each read opens its
    file and closes it again: safetensors maps a file into memory, and pages of a map that stays
    open count against the process until it is closed, so a reader of a whole checkpoint would
    hold all of it."""

    def __init__(self, directory: str, manifest: Manifest | None = None) -> None:
        self.directory = directory
        self.manifest = manifest if manifest is not None else read(directory)

    def _open(self, name: str):
        from safetensors import safe_open

        from ringzero.checkpoint.verify import regular_file
        path = regular_file(self.directory, name)
        try:
            return safe_open(path, framework="pt")
        except Exception as exc:  # noqa: BLE001 - OSError, or safetensors' own error for a bad file
            raise CheckpointError(f"cannot read {path}: {exc}") from None

    def piece(self, p: Piece) -> torch.Tensor:
        with self._open(p.file) as f:
            if p.key not in f.keys():
                raise CheckpointError(f"{p.file} has no tensor {p.key!r} that the manifest lists")
            return f.get_tensor(p.key).reshape(-1)

    def tensor(self, name: str) -> torch.Tensor:
        """Global tensor `name`, whole."""
        if name not in self.manifest.tensors:
            raise CheckpointError(f"checkpoint has no tensor {name!r}")
        return assemble(name, self.manifest.tensors[name], self.piece)

    def rng(self, rank: int) -> dict[str, torch.Tensor]:
        """Rank `rank`'s saved RNG states ({} when it saved none)."""
        name = self.manifest.rng.get(str(rank))
        if name is None:
            return {}
        with self._open(name) as f:
            return {k.removeprefix("rng/"): f.get_tensor(k) for k in f.keys() if k.startswith("rng/")}


def source(m: Manifest, name: str) -> str:
    """The saved tensor that fills `name` of the running job (see the module doc)."""
    kind, _, param = name.partition("/")
    if kind in ("param", "master") and f"master/{param}" in m.tensors:
        return f"master/{param}"
    if kind == "master":
        return f"param/{param}"
    return name


def check_model(m: Manifest, locals_: list[Local]) -> None:
    """CheckpointError when the running model's tensors are not the checkpoint's (another model)."""
    for l in locals_:
        src = source(m, l.name)
        e = m.tensors.get(src)
        if e is None:
            raise CheckpointError(f"the checkpoint has no {src!r}: it is of another model or was saved "
                                  "without the optimizer")
        if tuple(e.shape) != tuple(l.shape):
            raise CheckpointError(f"{src!r} is {list(e.shape)} in the checkpoint and {list(l.shape)} in this "
                                  "model: it is of another model")


@torch.no_grad()
def fill_weights(path: str, locals_: list[Local]) -> None:
    """Set the weight pieces of `locals_` ("param/" and "master/") from a consolidated safetensors
    file `path` (the model's parameter names as keys; `consolidate`); CheckpointError when it is
    not a file of this model."""
    from safetensors import safe_open
    by_name: dict[str, list[Local]] = {}
    for l in locals_:
        kind, _, name = l.name.partition("/")
        if kind in ("param", "master"):
            by_name.setdefault(name, []).append(l)
    try:
        f = safe_open(path, framework="pt")
    except Exception as exc:  # noqa: BLE001 - OSError, or safetensors' own error for a bad file
        raise CheckpointError(f"cannot read {path} as safetensors: {exc}") from None
    with f:
        keys = set(f.keys())
        for name in sorted(by_name):
            if name not in keys:
                raise CheckpointError(f"{path} has no tensor {name!r}: it is not a file of this model")
            full = f.get_tensor(name)
            want = by_name[name][0].shape
            if tuple(full.shape) != tuple(want):
                raise CheckpointError(f"{path}: {name!r} is {list(full.shape)}, this model's is {list(want)}")
            for l in by_name[name]:
                l.tensor.copy_(piece_of(full, l.tp, l.flat))


@torch.no_grad()
def fill(reader: Reader, locals_: list[Local]) -> None:
    """Copy every piece of `locals_` from the checkpoint, one global tensor at a time."""
    check_model(reader.manifest, locals_)
    by_source: dict[str, list[Local]] = {}
    for l in locals_:
        by_source.setdefault(source(reader.manifest, l.name), []).append(l)
    for name in sorted(by_source):
        full = reader.tensor(name)
        for l in by_source[name]:
            l.tensor.copy_(piece_of(full, l.tp, l.flat))
        del full
