"""Global tensors from pieces, and pieces from global tensors (the manifest's `tp` and `flat`).

Tensor-parallel slices follow Megatron-LM's layout (Shoeybi et al. 2019 §3): along `dim` the
tensor is `stride` stacked blocks (qkv: q, k, v), each cut into `parts` equal pieces, and slice r
is piece r of every block, concatenated; a vocabulary-parallel embedding is padded along `dim` to
parts × its slice's rows first (the padding rows are dropped again when assembling).
"""

from __future__ import annotations

from typing import Callable

import torch

from ringzero.checkpoint.coverage import check as check_coverage, slice_size
from ringzero.checkpoint.manifest import CheckpointError, Entry, Piece, TPSlice


def tp_slice(full: torch.Tensor, tp: TPSlice | None) -> torch.Tensor:
    """Slice `tp` of the global tensor `full` (the tensor itself when `tp` is None)."""
    if tp is None:
        return full
    rows = tp.parts * tp.shape[tp.dim]
    if full.shape[tp.dim] < rows:                      # vocabulary padding
        pad = list(full.shape)
        pad[tp.dim] = rows - full.shape[tp.dim]
        full = torch.cat([full, full.new_zeros(pad)], tp.dim)
    blocks = full.chunk(tp.stride, tp.dim)
    return torch.cat([b.chunk(tp.parts, tp.dim)[tp.index] for b in blocks], tp.dim)


def _join(slices: dict[int, torch.Tensor], tp: TPSlice, shape: tuple[int, ...]) -> torch.Tensor:
    """The global tensor of `shape` from its tp slices (index -> tensor)."""
    blocks = [slices[r].chunk(tp.stride, tp.dim) for r in range(tp.parts)]
    full = torch.cat([blocks[r][j] for j in range(tp.stride) for r in range(tp.parts)], tp.dim)
    return full.narrow(tp.dim, 0, shape[tp.dim])


def assemble(name: str, entry: Entry, read: Callable[[Piece], torch.Tensor]) -> torch.Tensor:
    """Global tensor `name` of `entry`, from its pieces (`read(piece)`: the piece's 1-D values).
    CheckpointError when its pieces do not cover it (`coverage.check`, which `verify` makes too)."""
    dtype = getattr(torch, entry.dtype)
    by_slice = check_coverage(name, entry)
    flats: dict[int | None, torch.Tensor] = {}
    for index, pieces in by_slice.items():
        flat = torch.empty(slice_size(entry, pieces[0]), dtype=dtype)
        for p in pieces:
            values = read(p)
            if values.numel() != p.numel():
                raise CheckpointError(f"tensor {name!r}: {p.file}[{p.key}] holds {values.numel()} values, "
                                      f"the manifest says {p.numel()}")
            flat[p.flat[0]:p.flat[1]] = values.to(dtype)
            del values
        flats[index] = flat
    if None in flats:
        return flats[None].view(entry.shape)
    tp = entry.pieces[0].tp                           # one layout for all slices (`coverage.check`)
    return _join({r: flats[r].view(tp.shape) for r in flats}, tp, entry.shape)


def piece_of(full: torch.Tensor, tp: TPSlice | None, flat: tuple[int, int]) -> torch.Tensor:
    """The values of the piece (`tp`, `flat`) of the global tensor `full`, 1-D."""
    return tp_slice(full, tp).reshape(-1)[flat[0]:flat[1]]
