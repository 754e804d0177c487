"""Which of this rank's tensors its local peers have mapped, and the peers' tensors it has mapped.

The bookkeeping behind `shared` (which makes such tensors): `find` tells a send whether its bytes
can go by reference, `theirs` gives a receive the sender's tensor to read them from. Process-wide:
a tensor made through one group's ranks may be sent through another group's channels.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

import torch

MIN_BYTES = 64 << 10
"""Smaller messages are copied: two copies of 64 KiB cost less than the acknowledgement's hand-off."""


@dataclasses.dataclass(frozen=True)
class _Region:
    index: int
    lo: int
    hi: int
    readers: frozenset[int]
    """Global ranks that mapped it: only a message to one of them may go by reference."""


_MINE: dict[int, _Region] = {}
_THEIRS: dict[tuple[int, int], torch.Tensor] = {}
"""(creator pid, region index) -> the peer's segment as a uint8 tensor (holding its mapping)."""
_NEXT = itertools.count()
_LOCK = threading.Lock()


def next_index() -> int:
    """A region number never used before by this process (names and references carry it)."""
    return next(_NEXT)


def add(index: int, lo: int, hi: int, readers, theirs: dict) -> None:
    """Record this rank's region `index` at [lo, hi) mapped by global ranks `readers`, and the
    peers' regions it mapped, {(creator pid, region): bytes}."""
    with _LOCK:
        _MINE[index] = _Region(index, lo, hi, frozenset(readers))
        _THEIRS.update(theirs)


def release(index: int, keys: tuple[tuple[int, int], ...]) -> None:
    """Forget region `index` (its memory is being unmapped, and the address may be reused) and
    this rank's mappings `keys` of the peers' regions made with it."""
    with _LOCK:
        _MINE.pop(index, None)
        for k in keys:
            _THEIRS.pop(k, None)


def find(addr: int, nbytes: int, reader: int) -> tuple[int, int] | None:
    """(region, offset) when bytes [addr, addr + nbytes) lie in a shared tensor of this rank that
    global rank `reader` has mapped and are worth sending by reference; None: copy them."""
    if nbytes < MIN_BYTES:
        return None
    for r in list(_MINE.values()):
        if r.lo <= addr and addr + nbytes <= r.hi:
            return (r.index, addr - r.lo) if reader in r.readers else None
    return None


def theirs(pid: int, region: int) -> torch.Tensor:
    """Process `pid`'s shared tensor `region`, as bytes (mapped by `shared.zeros`)."""
    got = _THEIRS.get((pid, region))
    if got is None:
        raise RuntimeError(f"a message refers to shared tensor {region} of pid {pid}, which this rank never mapped")
    return got
