"""Whether a manifest's pieces make up each of its global tensors whole: the one check that loading
(`slices.assemble`) and verifying (`verify`) both make, so `checkpoint inspect --verify` passes
exactly the checkpoints that `consolidate` and `train --resume` load.

A tensor's pieces are either all whole-tensor pieces (`tp` null) or all tensor-parallel pieces of
one layout (the same dim, stride, parts and slice shape, Megatron's: `slices`); then each slice
0..parts-1 has pieces, and the [lo, hi) ranges of the pieces of each slice (or of the whole tensor)
leave no element of it out. Ranges may overlap: ranks that hold the same values may each save them.
Torch-free: the command line checks a manifest before torch is imported.
"""

from __future__ import annotations

import math

from ringzero.checkpoint.manifest import CheckpointError, Entry, Piece


def slice_size(entry: Entry, piece: Piece) -> int:
    """Elements of the slice `piece` is a range of: its tensor-parallel slice, or the whole tensor."""
    return math.prod(piece.tp.shape) if piece.tp is not None else entry.numel()


def _gap(spans: list[tuple[int, int]], size: int) -> tuple[int, int] | None:
    """The first [lo, hi) of [0, size) that no span covers (None: they cover it all)."""
    reach = 0
    for lo, hi in sorted(spans):
        if lo > reach:
            return reach, lo
        reach = max(reach, hi)
    return (reach, size) if reach < size else None


def _layout(name: str, pieces: list[Piece]) -> None:
    """CheckpointError unless the pieces are all whole or all slices of one tensor-parallel layout."""
    layouts = {None if p.tp is None else (p.tp.dim, p.tp.stride, p.tp.parts, p.tp.shape) for p in pieces}
    if None in layouts and len(layouts) > 1:
        raise CheckpointError(f"tensor {name!r} mixes whole and tensor-parallel pieces")
    if len(layouts) > 1:
        raise CheckpointError(f"tensor {name!r} mixes tensor-parallel layouts (dim, stride, parts, slice shape): "
                              f"{', '.join(map(str, sorted(layouts)))}")


def check(name: str, entry: Entry) -> dict[int | None, list[Piece]]:
    """The pieces of tensor `name` by tensor-parallel slice index (None: the whole tensor), once
    they cover it; a one-line CheckpointError naming the first gap otherwise."""
    _layout(name, entry.pieces)
    by_slice: dict[int | None, list[Piece]] = {}
    for p in entry.pieces:
        by_slice.setdefault(p.tp.index if p.tp is not None else None, []).append(p)
    parts = entry.pieces[0].tp.parts if entry.pieces[0].tp is not None else None
    if parts is not None and sorted(by_slice) != list(range(parts)):
        raise CheckpointError(f"tensor {name!r} is incomplete: it has tensor-parallel slices {sorted(by_slice)} "
                              f"of {parts}")
    for index, pieces in sorted(by_slice.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        size = slice_size(entry, pieces[0])
        gap = _gap([p.flat for p in pieces], size)
        if gap is not None:
            whose = "its" if index is None else f"its tensor-parallel slice {index}'s"
            raise CheckpointError(f"tensor {name!r} is incomplete: elements [{gap[0]}, {gap[1]}) of {whose} {size} "
                                  "are in no piece")
    return by_slice
