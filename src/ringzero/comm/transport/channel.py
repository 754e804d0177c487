"""One direction between two ranks: a single-producer single-consumer ring in shared memory.

A channel's segment (created by the sender, `segment`; byte layout in `layout`) holds a header,
four semaphores, ENTRIES entries and SLOTS slots of SLOT_BYTES. An entry describes one piece of a
message (tag, message bytes, payload bytes); a piece copied through the channel also takes the
next slot, a message left in the sender's shared tensor (`shared`) takes none. The sender takes a
`space` unit (a free entry) and, to copy, a `bufs` unit (a free slot), writes them and posts `data`;
the receiver takes a `data` unit, reads entry (tail mod ENTRIES) and its slot, and posts `bufs` and
`space`: the semaphores are the head/tail counters, and their post/wait pairs order the bytes
(`sem`). A message of B bytes fills ceil(B / SLOT_BYTES) consecutive slots (one entry each; one
entry and no slot for B = 0), so the receiver copies the first slot out while the sender fills the
next: one copy in, one copy out, overlapped. Entries and slots are both taken in order, so each
side finds the next slot by counting.

The two ends are `outbound.Outbound` (sends never block their caller) and `inbound.Inbound`
(a receive moves its data when waited for); this module is the segment they share.
"""

from __future__ import annotations

import ctypes
import struct
import time

import numpy as np
import torch

from ringzero.comm.transport.layout import (ACKS as _ACKS, BUFS as _BUFS, DATA as _DATA, ENTRY_BYTES, HEADER, MAGIC,
                                            SPACE as _SPACE)
from ringzero.comm.transport.segment import alive
from ringzero.comm.transport.sem import PeerGone, Semaphore

pack, unpack = struct.Struct("qqqq").pack_into, struct.Struct("qqqq").unpack_from
copy = ctypes.memmove
"""Bytes between a tensor and a slot: one libc memmove (the GIL released), which costs a fraction of a
torch `copy_`'s dispatch on the small messages whose hand-off is the whole cost."""


class Ring:
    """The mapped segment: its bytes as a tensor and at an address, its semaphores."""

    def __init__(self, mm, slots: int, slot_bytes: int, entries: int, peer: str, peer_pid: int,
                 timeout_s: float) -> None:
        self.mm = mm
        self.bytes = torch.frombuffer(mm, dtype=torch.uint8)
        self._anchor = ctypes.c_char.from_buffer(mm)       # keeps the address valid while mapped
        self.base = base = ctypes.addressof(self._anchor)
        self.space, self.data = Semaphore(base + _SPACE), Semaphore(base + _DATA)
        self.acks, self.bufs = Semaphore(base + _ACKS), Semaphore(base + _BUFS)
        self.slots, self.slot_bytes, self.entries = slots, slot_bytes, entries
        self.first_slot = HEADER + entries * ENTRY_BYTES
        self.peer, self.peer_pid, self.timeout_s = peer, peer_pid, timeout_s

    def header(self, k: int, tag: int, n: int, payload: int, at: int = 0) -> None:
        """Write entry k: (tag, message bytes, payload bytes, and for a message left in the sender's
        shared tensor `layout.REF - region` as the payload and its offset `at`)."""
        pack(self.mm, HEADER + (k % self.entries) * ENTRY_BYTES, tag, n, payload, at)

    def read_header(self, k: int) -> tuple[int, int, int, int]:
        """Entry k's (tag, message bytes, payload bytes, shared offset)."""
        return unpack(self.mm, HEADER + (k % self.entries) * ENTRY_BYTES)

    def slot(self, j: int) -> int:
        """Byte offset of slot j's payload."""
        return self.first_slot + (j % self.slots) * self.slot_bytes

    def alive(self) -> bool:
        return alive(self.peer_pid)

    def take(self, sem: Semaphore) -> None:
        try:
            sem.wait(self.alive, time.monotonic() + self.timeout_s)
        except PeerGone:
            raise RuntimeError(f"{self.peer} (pid {self.peer_pid}) exited during a shared-memory transfer") from None
        except TimeoutError:
            raise RuntimeError(f"a shared-memory transfer with {self.peer} (pid {self.peer_pid}) timed out "
                               f"after {self.timeout_s:.0f} s") from None


def init_header(mm, slots: int, slot_bytes: int, sender_pid: int, entries: int) -> None:
    """Fill a fresh segment's header (its creator, before anyone attaches)."""
    words = np.frombuffer(mm, dtype=np.int64)
    words[1], words[2], words[3], words[4] = slots, slot_bytes, sender_pid, entries
    base = ctypes.c_char.from_buffer(mm)
    for off, value in ((_SPACE, entries), (_DATA, 0), (_ACKS, 0), (_BUFS, slots)):
        Semaphore(ctypes.addressof(base) + off).init(value)
    del base
    words[0] = MAGIC                                   # last: the header is complete


def ready(mm) -> bool:
    return int(np.frombuffer(mm, dtype=np.int64, count=1)[0]) == MAGIC


def ring(mm, peer: str, peer_pid: int, timeout_s: float) -> Ring:
    """The ring in an attached segment (its creator filled the header)."""
    w = np.frombuffer(mm, dtype=np.int64)
    return Ring(mm, int(w[1]), int(w[2]), int(w[4]), peer, peer_pid, timeout_s)
