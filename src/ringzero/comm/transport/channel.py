"""One direction between two ranks: a single-producer single-consumer ring of slots in shared memory.

A channel's segment (created by the sender, `segment`; byte layout in `layout`) holds a header,
two semaphores, `space` (free slots, starting at SLOTS) and `data` (filled slots, starting at 0),
and SLOTS slots, each a small header (tag, message bytes, payload bytes) and SLOT_BYTES of payload.
The sender takes a `space` unit, writes slot (head mod SLOTS) and posts `data`; the receiver takes
a `data` unit, reads slot (tail mod SLOTS) and posts `space`: the semaphores are the head/tail
counters, and their post/wait pairs order the slot's bytes (`sem`). A message of B bytes fills
ceil(B / SLOT_BYTES) consecutive slots (one, empty, for B = 0), so the receiver copies the first
slot out while the sender fills the next: one copy in, one copy out, overlapped.

The two ends are `outbound.Outbound` (sends never block their caller) and `inbound.Inbound`
(a receive moves its data when waited for); this module is the segment they share.
"""

from __future__ import annotations

import ctypes
import struct
import time

import numpy as np
import torch

from ringzero.comm.transport.layout import ACKS as _ACKS, DATA as _DATA, HEADER, MAGIC, SLOT_HEADER, SPACE as _SPACE
from ringzero.comm.transport.segment import alive
from ringzero.comm.transport.sem import PeerGone, Semaphore

pack, unpack = struct.Struct("qqqq").pack_into, struct.Struct("qqqq").unpack_from
copy = ctypes.memmove
"""Bytes between a tensor and a slot: one libc memmove (the GIL released), which costs a fraction of a
torch `copy_`'s dispatch on the small messages whose hand-off is the whole cost."""


class Ring:
    """The mapped segment: its bytes as a tensor and at an address, its two semaphores."""

    def __init__(self, mm, slots: int, slot_bytes: int, peer: str, peer_pid: int, timeout_s: float) -> None:
        self.mm = mm
        self.bytes = torch.frombuffer(mm, dtype=torch.uint8)
        self._anchor = ctypes.c_char.from_buffer(mm)       # keeps the address valid while mapped
        self.base = base = ctypes.addressof(self._anchor)
        self.space, self.data, self.acks = Semaphore(base + _SPACE), Semaphore(base + _DATA), Semaphore(base + _ACKS)
        self.slots, self.slot_bytes = slots, slot_bytes
        self.stride = SLOT_HEADER + slot_bytes
        self.peer, self.peer_pid, self.timeout_s = peer, peer_pid, timeout_s

    def header(self, k: int, tag: int, n: int, payload: int, at: int = 0) -> int:
        """Write slot k's header (tag, message bytes, payload bytes, and for a message left in the
        sender's shared tensor `layout.REF - region` as the payload and its offset `at`); returns
        its payload's offset."""
        off = HEADER + (k % self.slots) * self.stride
        pack(self.mm, off, tag, n, payload, at)
        return off + SLOT_HEADER

    def read_header(self, k: int) -> tuple[int, int, int, int, int]:
        """Slot k's (tag, message bytes, payload bytes, shared offset, payload offset)."""
        off = HEADER + (k % self.slots) * self.stride
        return (*unpack(self.mm, off), off + SLOT_HEADER)

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


def init_header(mm, slots: int, slot_bytes: int, sender_pid: int) -> None:
    """Fill a fresh segment's header (its creator, before anyone attaches)."""
    words = np.frombuffer(mm, dtype=np.int64)
    words[1], words[2], words[3] = slots, slot_bytes, sender_pid
    base = ctypes.c_char.from_buffer(mm)
    Semaphore(ctypes.addressof(base) + _SPACE).init(slots)
    Semaphore(ctypes.addressof(base) + _DATA).init(0)
    Semaphore(ctypes.addressof(base) + _ACKS).init(0)
    del base
    words[0] = MAGIC                                   # last: the header is complete


def ready(mm) -> bool:
    return int(np.frombuffer(mm, dtype=np.int64, count=1)[0]) == MAGIC


def ring(mm, peer: str, peer_pid: int, timeout_s: float) -> Ring:
    """The ring in an attached segment (its creator filled the header)."""
    w = np.frombuffer(mm, dtype=np.int64)
    return Ring(mm, int(w[1]), int(w[2]), peer, peer_pid, timeout_s)
