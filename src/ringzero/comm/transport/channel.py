"""One direction between two ranks: a single-producer single-consumer ring of slots in shared memory.

A channel's segment (created by the sender, `segment`; byte layout in `layout`) holds a header,
two semaphores, `space` (free slots, starting at SLOTS) and `data` (filled slots, starting at 0),
and SLOTS slots, each a small header (tag, message bytes, payload bytes) and SLOT_BYTES of payload.
The sender takes a `space` unit, writes slot (head mod SLOTS) and posts `data`; the receiver takes
a `data` unit, reads slot (tail mod SLOTS) and posts `space`: the semaphores are the head/tail
counters, and their post/wait pairs order the slot's bytes (`sem`). A message of B bytes fills
ceil(B / SLOT_BYTES) consecutive slots (one, empty, for B = 0), so the receiver copies the first
slot out while the sender fills the next: one copy in, one copy out, overlapped.

Messages match as gloo matches them: by (peer, tag), in posting order. The receiver keeps its
posted receives in order; a message whose tag no posted receive wants yet is read into a side
buffer (MPI's unexpected queue) so that the ring keeps moving, and a later receive of that tag
takes it from there.

Sends never block their caller: `send` writes the slots that are free now (a message that fits,
the common case, completes there), and a message that does not fit is finished by the channel's
writer thread as the receiver frees slots. Otherwise two ranks that post more than a ring's worth
of sends to each other before receiving (the pipelined ring posts a whole chunk's segments) would
each wait for the other to drain. The caller must not touch a sent tensor until its send's
`wait()` returns, as with gloo.
"""

from __future__ import annotations

import collections
import ctypes
import struct
import threading
import time

import numpy as np
import torch

from ringzero.comm.transport.layout import DATA as _DATA, HEADER, MAGIC, SLOT_HEADER, SPACE as _SPACE
from ringzero.comm.transport.sem import PeerGone, Semaphore

IDLE_S = 2.0
"""A writer thread with nothing to write for this long ends (the next long send starts another)."""


_pack, _unpack = struct.Struct("qqq").pack_into, struct.Struct("qqq").unpack_from
_copy = ctypes.memmove
"""Bytes between a tensor and a slot: one libc memmove (the GIL released), which costs a fraction of a
torch `copy_`'s dispatch on the small messages whose hand-off is the whole cost."""


class _Ring:
    """The mapped segment: its words, its bytes as a tensor, its two semaphores."""

    def __init__(self, mm, slots: int, slot_bytes: int, peer: str, peer_pid: int, timeout_s: float) -> None:
        self.mm = mm
        self.words = np.frombuffer(mm, dtype=np.int64)
        self.bytes = torch.frombuffer(mm, dtype=torch.uint8)
        self._anchor = ctypes.c_char.from_buffer(mm)       # keeps the address valid while mapped
        self.base = base = ctypes.addressof(self._anchor)
        self.space, self.data = Semaphore(base + _SPACE), Semaphore(base + _DATA)
        self.slots, self.slot_bytes = slots, slot_bytes
        self.stride = SLOT_HEADER + slot_bytes
        self.peer, self.peer_pid, self.timeout_s = peer, peer_pid, timeout_s

    def header(self, k: int, tag: int, n: int, payload: int) -> int:
        """Write slot k's header (tag, message bytes, payload bytes); returns its payload's offset."""
        off = HEADER + (k % self.slots) * self.stride
        _pack(self.mm, off, tag, n, payload)
        return off + SLOT_HEADER

    def read_header(self, k: int) -> tuple[int, int, int, int]:
        """Slot k's (tag, message bytes, payload bytes, payload offset)."""
        off = HEADER + (k % self.slots) * self.stride
        return (*_unpack(self.mm, off), off + SLOT_HEADER)

    def alive(self) -> bool:
        from ringzero.comm.transport.segment import alive
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
    del base
    words[0] = MAGIC                                   # last: the header is complete


def ready(mm) -> bool:
    return int(np.frombuffer(mm, dtype=np.int64, count=1)[0]) == MAGIC


class Done:
    """A completed operation."""

    __slots__ = ()

    def wait(self, *args) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


DONE = Done()


class _Send:
    __slots__ = ("data", "tag", "sent", "written", "event", "error")

    def __init__(self, data: torch.Tensor, tag: int) -> None:
        self.data, self.tag, self.sent, self.written = data, tag, 0, False
        self.event, self.error = None, None

    def wait(self, *args) -> bool:
        while not self.event.wait(1.0):
            pass
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.event.is_set()


class Outbound:
    """The sending end of a channel (this rank created its segment)."""

    def __init__(self, ring: _Ring) -> None:
        self.r = ring
        self.head = 0
        self.queue: collections.deque[_Send] = collections.deque()
        self.lock = threading.Condition()
        self.thread = None

    def send(self, data: torch.Tensor, tag: int):
        """Post a send of `data` (1-D uint8, contiguous); returns a handle with `wait()`."""
        n, r = data.numel(), self.r
        with self.lock:
            if n <= r.slot_bytes and not self.queue and r.space.trywait():
                off = r.header(self.head, tag, n, n)     # one free slot holds it: written, done
                if n:
                    _copy(r.base + off, data.data_ptr(), n)
                self.head += 1
                r.data.post()
                return DONE
        op = _Send(data, tag)
        with self.lock:
            if not self.queue:
                self._write(op, block=False)
                if op.written:
                    return DONE
            op.event = threading.Event()
            self.queue.append(op)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True, name="ringzero-shm-writer")
                self.thread.start()
            self.lock.notify()
        return op

    def _write(self, op: _Send, block: bool) -> None:
        """Write op's slots while slots are free (`block`: waiting for each)."""
        r, data, n = self.r, op.data, len(op.data)
        while not op.written:
            if block:
                r.take(r.space)
            elif not r.space.trywait():
                return
            k = min(r.slot_bytes, n - op.sent)
            off = r.header(self.head, op.tag, n, k)
            if k:
                _copy(r.base + off, data.data_ptr() + op.sent, k)
            op.sent += k
            op.written = op.sent >= n
            self.head += 1
            r.data.post()

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.queue:
                    if not self.lock.wait(IDLE_S) and not self.queue:
                        self.thread = None        # idle: end, so a dropped group's channel is freed
                        return
                op = self.queue[0]
            try:
                self._write(op, block=True)
            except BaseException as exc:             # the peer is gone: fail every queued send
                with self.lock:
                    for q in self.queue:
                        q.error = exc
                        q.event.set()
                    self.queue.clear()
                continue
            with self.lock:
                self.queue.popleft()
            op.event.set()


class _Recv:
    __slots__ = ("out", "tag", "done", "channel", "fold")

    def __init__(self, out: torch.Tensor, tag: int, channel: "Inbound", fold=None) -> None:
        self.out, self.tag, self.done, self.channel, self.fold = out, tag, False, channel, fold

    def take(self, lo: int, src: torch.Tensor) -> None:
        """Bytes [lo, lo + len(src)) of the message: copied into `out`, or with `fold` (a typed
        `out` and `dst = op(dst, src)`) reduced into it straight from the slot."""
        if self.fold is None:
            _copy(self.out.data_ptr() + lo, src.data_ptr(), len(src))
        else:
            item = self.out.element_size()
            self.fold(self.out[lo // item:(lo + len(src)) // item], src.view(self.out.dtype))

    def wait(self, *args) -> bool:
        if not self.done:
            self.channel.complete(self)
        return True

    def is_completed(self) -> bool:
        return self.done


class Inbound:
    """The receiving end of a channel (its sender created the segment). One thread reads the ring
    at a time (`reading`); posting a receive only takes the short `lock`, never waits."""

    def __init__(self, attach) -> None:
        self.r: _Ring | None = None
        self._attach = attach
        """Opens the sender's segment: called by the first wait, never by a post, since two ranks
        that each post a receive before a send would otherwise wait for each other's segment."""
        self.tail = 0
        self.posted: collections.deque[_Recv] = collections.deque()
        self.early: dict[int, collections.deque[torch.Tensor]] = {}
        self.lock, self.reading = threading.Lock(), threading.Lock()

    def recv(self, out: torch.Tensor, tag: int, fold=None):
        """Post a receive into `out` (1-D uint8, contiguous) of the next message tagged `tag`; with
        `fold(dst, src)`, `out` is a typed tensor the message is reduced into (`_Recv.take`)."""
        op = _Recv(out, tag, self, fold)
        with self.lock:
            waiting = self.early.get(tag)
            if waiting:
                self._deliver(op, waiting.popleft())
                return op
            self.posted.append(op)
        return op

    def complete(self, op: _Recv) -> None:
        with self.reading:
            if self.r is None:
                self.r = self._attach()
            while not op.done:
                self._read_message()

    def _deliver(self, op: _Recv, got: torch.Tensor) -> None:
        self._fit(op, len(got))
        op.take(0, got)
        op.done = True

    def _fit(self, op: _Recv, n: int) -> None:
        want = op.out.numel() * op.out.element_size()
        if want != n:
            raise RuntimeError(f"a message of {n} bytes (tag {op.tag}) met a receive of {want} bytes")

    def _read_message(self) -> None:
        """Read the next message whole, into the first posted receive of its tag or aside."""
        r = self.r
        r.take(r.data)
        tag, n, k, off = r.read_header(self.tail)
        with self.lock:
            target = next((op for op in self.posted if op.tag == tag), None)
            if target is not None:
                self._fit(target, n)
                self.posted.remove(target)
        aside = torch.empty(n, dtype=torch.uint8) if target is None else None
        got = 0
        while True:
            if k:
                if target is None:
                    _copy(aside.data_ptr() + got, r.base + off, k)
                else:
                    target.take(got, r.bytes[off:off + k])
            got += k
            self.tail += 1
            r.space.post()
            if got >= n:
                break
            r.take(r.data)
            _, _, k, off = r.read_header(self.tail)
        if target is not None:
            target.done = True
            return
        with self.lock:                   # a receive of this tag may have been posted meanwhile
            later = next((op for op in self.posted if op.tag == tag), None)
            if later is None:
                self.early.setdefault(tag, collections.deque()).append(aside)
            else:
                self.posted.remove(later)
                self._deliver(later, aside)


def outbound(mm, peer: str, peer_pid: int, timeout_s: float) -> Outbound:
    w = np.frombuffer(mm, dtype=np.int64)
    return Outbound(_Ring(mm, int(w[1]), int(w[2]), peer, peer_pid, timeout_s))


def ring(mm, peer: str, peer_pid: int, timeout_s: float) -> _Ring:
    """The ring in an attached segment (its creator filled the header)."""
    w = np.frombuffer(mm, dtype=np.int64)
    return _Ring(mm, int(w[1]), int(w[2]), peer, peer_pid, timeout_s)
