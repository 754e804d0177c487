"""Global tensors from pieces, and pieces from global tensors (the manifest's `tp` and `flat`).

Tensor-parallel slices follow Megatron-LM's layout (Shoeybi et al. 2019 §3): along `dim` the
tensor is `stride` stacked blocks (qkv: q, k, v), each cut into `parts` equal pieces, and slice r
is piece r of every block, concatenated; a vocabulary-parallel embedding is padded along `dim` to
parts × its slice's rows first (the padding rows are dropped again when assembling).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

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


def _check_cover(name: str, spans: list[tuple[int, int]], size: int) -> None:
    """CheckpointError unless the [lo, hi) `spans` cover [0, size) (overlaps allowed)."""
    reach = 0
    for lo, hi in sorted(spans):
        if lo > reach:
            break
        reach = max(reach, hi)
    if reach < size:
        raise CheckpointError(f"tensor {name!r} is incomplete: its pieces leave elements from {reach} of {size} "
                              "uncovered")


def assemble(name: str, entry: Entry, read: Callable[[Piece], torch.Tensor]) -> torch.Tensor:
    """Global tensor `name` of `entry`, from its pieces (`read(piece)`: the piece's 1-D values).
    CheckpointError when its pieces do not cover it."""
    dtype = getattr(torch, entry.dtype)
    by_slice: dict[int | None, list[Piece]] = {}
    for p in entry.pieces:
        by_slice.setdefault(p.tp.index if p.tp is not None else None, []).append(p)
    tps = {p.tp for p in entry.pieces if p.tp is not None}
    if tps and None in by_slice:
        raise CheckpointError(f"tensor {name!r} mixes whole and tensor-parallel pieces")
    flats: dict[int | None, torch.Tensor] = {}
    for index, pieces in by_slice.items():
        size = math.prod(pieces[0].tp.shape) if index is not None else entry.numel()
        _check_cover(name, [p.flat for p in pieces], size)
        flat = torch.empty(size, dtype=dtype)
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
    tp = next(iter(tps))
    if sorted(flats) != list(range(tp.parts)):
        raise CheckpointError(f"tensor {name!r} is incomplete: it has tensor-parallel slices {sorted(flats)} "
                              f"of {tp.parts}")
    slices = {r: flats[r].view(by_slice[r][0].tp.shape) for r in flats}
    return _join(slices, tp, entry.shape)


def piece_of(full: torch.Tensor, tp: TPSlice | None, flat: tuple[int, int]) -> torch.Tensor:
    """The values of the piece (`tp`, `flat`) of the global tensor `full`, 1-D."""
    return tp_slice(full, tp).reshape(-1)[flat[0]:flat[1]]
