"""The sending end of a channel (`channel`): never blocks its caller.

`send` writes the slots that are free now (a message that fits, the common case, completes there),
and a message that does not fit is finished by the channel's writer thread as the receiver frees
slots. Otherwise two ranks that post more than a ring's worth of sends to each other before
receiving (the pipelined ring posts a whole chunk's segments) would each wait for the other to
drain. The caller must not touch a sent tensor until its send's `wait()` returns, as with gloo.

A message cut from this rank's shared tensor (`shared`) takes one entry and no slot: its entry
says where the bytes are, the receiver reads them there and posts `acks`, and the send's `wait()`
returns once the receiver has posted the acknowledgement of it (messages are read in order, so the
k-th such message of a channel is acknowledged by its k-th post).
"""

from __future__ import annotations

import collections
import threading

import torch

from ringzero.comm.transport.channel import Ring, copy
from ringzero.comm.transport.layout import REF

IDLE_S = 2.0
"""A writer thread with nothing to write for this long ends (the next long send starts another)."""


class Done:
    """A completed operation."""

    __slots__ = ()

    def wait(self, *args) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


DONE = Done()


class _Send:
    __slots__ = ("data", "tag", "sent", "written", "event", "error", "ref")

    def __init__(self, data: torch.Tensor, tag: int, ref=None) -> None:
        self.data, self.tag, self.sent, self.written = data, tag, 0, False
        self.event, self.error, self.ref = None, None, ref

    def wait(self, *args) -> bool:
        while not self.event.wait(1.0):
            pass
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.event.is_set()


class _Acked:
    """A message sent by reference: done once it is written and the receiver has acknowledged it."""

    __slots__ = ("out", "seq", "op")

    def __init__(self, out: "Outbound", seq: int, op: _Send | None) -> None:
        self.out, self.seq, self.op = out, seq, op

    def wait(self, *args) -> bool:
        if self.op is not None:
            self.op.wait()
        self.out.acked(self.seq)
        return True

    def is_completed(self) -> bool:
        return self.out.n_acked > self.seq


class Outbound:
    """The sending end of a channel (this rank created its segment)."""

    def __init__(self, ring: Ring) -> None:
        self.r = ring
        self.head = self.slot = 0
        """The next entry and the next slot to write."""
        self.queue: collections.deque[_Send] = collections.deque()
        self.lock = threading.Condition()
        self.thread = None
        self.n_refs = self.n_acked = 0
        self.ack_lock = threading.Lock()

    def acked(self, seq: int) -> None:
        """Wait until the receiver has acknowledged reference message `seq` (and all before it)."""
        with self.ack_lock:
            while self.n_acked <= seq:
                self.r.take(self.r.acks)
                self.n_acked += 1

    def send(self, data: torch.Tensor, tag: int, ref: tuple[int, int] | None = None):
        """Post a send of `data` (1-D uint8, contiguous); returns a handle with `wait()`. `ref`
        (region, offset): the bytes lie in this rank's shared tensor and go by reference."""
        if ref is not None:
            return self._send_ref(data, tag, ref)
        n, r = data.numel(), self.r
        with self.lock:
            if n <= r.slot_bytes and not self.queue and self._free(n, block=False):
                self._piece(tag, n, data.data_ptr(), n)    # one free slot holds it: written, done
                return DONE
        op = _Send(data, tag)
        with self.lock:
            if not self.queue:
                self._write(op, block=False)
                if op.written:
                    return DONE
            op.event = threading.Event()
            self.queue.append(op)
            self._start()
            self.lock.notify()
        return op

    def _send_ref(self, data: torch.Tensor, tag: int, ref: tuple[int, int]):
        op = _Send(data, tag, ref)
        with self.lock:
            seq, self.n_refs = self.n_refs, self.n_refs + 1
            if not self.queue:
                self._write(op, block=False)
                if op.written:
                    return _Acked(self, seq, None)
            op.event = threading.Event()
            self.queue.append(op)
            self._start()
            self.lock.notify()
        return _Acked(self, seq, op)

    def _start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, daemon=True, name="ringzero-shm-writer")
            self.thread.start()

    def _free(self, k: int, block: bool) -> bool:
        """Take an entry and, for k > 0 bytes to copy, a slot (`block`: waiting for them)."""
        r = self.r
        if block:
            r.take(r.space)
            if k:
                r.take(r.bufs)
            return True
        if not r.space.trywait():
            return False
        if k and not r.bufs.trywait():
            r.space.post()                           # no slot free: give the entry back
            return False
        return True

    def _piece(self, tag: int, n: int, src: int, k: int) -> None:
        """Write one piece of a message of n bytes: k bytes from address `src` into the next slot."""
        r = self.r
        r.header(self.head, tag, n, k)
        if k:
            copy(r.base + r.slot(self.slot), src, k)
            self.slot += 1
        self.head += 1
        r.data.post()

    def _write(self, op: _Send, block: bool) -> None:
        """Write op's pieces while entries and slots are free (`block`: waiting for each)."""
        r, data, n = self.r, op.data, len(op.data)
        if op.ref is not None:                       # one entry, no slot: where the bytes are
            if not self._free(0, block):
                return
            region, at = op.ref
            r.header(self.head, op.tag, n, REF - region, at)
            op.sent, op.written = n, True
            self.head += 1
            r.data.post()
            return
        while not op.written:
            k = min(r.slot_bytes, n - op.sent)
            if not self._free(k, block):
                return
            self._piece(op.tag, n, data.data_ptr() + op.sent, k)
            op.sent += k
            op.written = op.sent >= n

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
