"""The sending end of a channel (`channel`): never blocks its caller.

`send` writes the slots that are free now (a message that fits, the common case, completes there),
and a message that does not fit is finished by the channel's writer thread as the receiver frees
slots. Otherwise two ranks that post more than a ring's worth of sends to each other before
receiving (the pipelined ring posts a whole chunk's segments) would each wait for the other to
drain. The caller must not touch a sent tensor until its send's `wait()` returns, as with gloo.
"""

from __future__ import annotations

import collections
import threading

import torch

from ringzero.comm.transport.channel import Ring, copy

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

    def __init__(self, ring: Ring) -> None:
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
                    copy(r.base + off, data.data_ptr(), n)
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
                copy(r.base + off, data.data_ptr() + op.sent, k)
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
