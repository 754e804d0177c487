"""Tensors in shared memory that the peers of this host read in place (registered buffers).

A message copied through a channel costs its sender a copy into the slots and its receiver a copy
(or a reduction) out of them. A tensor made by `zeros(numel, dtype, group)` lives in a segment that
every other rank of the group on this host has mapped, so a message cut from it travels as a
reference, its bytes left where they are: the receiver copies or reduces straight out of the
sender's tensor and then posts the channel's `acks`, and the sender's `wait()` returns only after
that acknowledgement, so the sender may not write the bytes before the receiver has read them
(the contract every send already has). This is NCCL's user-buffer registration (`ncclMemAlloc`,
`ncclCommRegister`) and MPI-3's `MPI_Win_allocate_shared`, for the CPU: the all-gather of a ring
all-reduce loses both its copies into the slots and its reduce-scatter the sender's copy.

`zeros` is collective over `group` (every rank calls it, in the same order): each rank makes its
segment (`segment.create`: 0600, O_EXCL, reserved), the group agrees that all of them could (a
/dev/shm too small for one rank gives every rank a plain tensor, never half a registration),
each rank maps every local peer's segment (`segment.attach`: owner, mode and size checked), and
after a second agreement each rank unlinks its own name: from then on only the mappings hold the
memory, which the kernel frees when the last process holding it ends, by exit or by `kill -9`.
A /dev/shm that could not also hold the channels the group's local ranks may open gives plain
tensors too.
Under transport "gloo", on a group with no other rank on this host, or for a non-CPU tensor, it is
`torch.zeros`.
"""

from __future__ import annotations

import mmap
import os
import weakref

import torch
import torch.distributed as dist

from ringzero.comm.transport import hosts, layout, regions, segment
from ringzero.comm.transport.route import p2p
from ringzero.comm.transport.shm import ShmGroup

_PAGE = mmap.PAGESIZE


def zeros(numel: int, dtype: torch.dtype, group=None) -> torch.Tensor:
    """A zeroed 1-D tensor of `numel` elements that the local peers of `group` read in place
    (module doc); collective over `group`."""
    sg = p2p(group, torch.device("cpu")) if dist.is_initialized() else None
    if not isinstance(sg, ShmGroup):
        return torch.zeros(numel, dtype=dtype)
    pg = group if group is not None else dist.group.WORLD
    size = max(_PAGE, -(-numel * dtype.itemsize // _PAGE) * _PAGE)
    index = regions.next_index()
    name = _name(os.getpid(), dist.get_rank(), index)
    peers = [p for p in range(len(sg.ranks)) if p != sg.me and sg.local(p)]
    mm = None
    # Leave /dev/shm room for the channels the group's ranks of this host may still open (made when
    # a pair first talks, so after this): a tensor that took it would fail a later send, not here.
    room = segment.free_bytes() - (len(peers) + 1) * size >= layout.channels_bytes([len(peers) + 1])
    if peers and room:
        try:
            mm = segment.create(name, size)
        except OSError:                 # /dev/shm too small: every rank takes a plain tensor
            mm = None
    mine = torch.tensor([int(mm is not None or not peers), index, size, os.getpid()], dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in sg.ranks]
    dist.all_gather(everyone, mine, group=pg)
    if not all(int(t[0]) for t in everyone):
        if mm is not None:
            segment.unlink(name)
        return torch.zeros(numel, dtype=dtype)
    try:
        theirs = {}
        for p in peers:
            _, idx, nbytes, pid = (int(x) for x in everyone[p])
            got = segment.attach(_name(pid, sg.ranks[p], idx), nbytes)
            if got is None:
                raise RuntimeError(f"rank {sg.ranks[p]}'s shared tensor vanished before rank "
                                   f"{sg.ranks[sg.me]} mapped it")
            theirs[(pid, idx)] = torch.frombuffer(got, dtype=torch.uint8)
        dist.barrier(group=pg)          # every peer has mapped this rank's segment: drop its name
    finally:
        if mm is not None:
            segment.unlink(name)
    if mm is None:                      # no other rank of the group on this host
        return torch.zeros(numel, dtype=dtype)
    out = torch.frombuffer(mm, dtype=dtype, count=numel)
    regions.add(index, out.data_ptr(), out.data_ptr() + size, (sg.ranks[p] for p in peers), theirs)
    # When the last view of the tensor dies its memory is unmapped and the address may be reused:
    # the region is forgotten then, with this rank's mappings of the peers' tensors made with it.
    weakref.finalize(mm, regions.release, index, tuple(theirs))
    return out


def _name(pid: int, rank: int, index: int) -> str:
    return segment.name(hosts.token(), pid, "reg", rank, index)
