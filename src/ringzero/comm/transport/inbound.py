"""The receiving end of a channel (`channel`): a receive moves its data when it is waited for.

Messages match as gloo matches them: by (peer, tag), in posting order. The receiver keeps its
posted receives in order; a message whose tag no posted receive wants yet is read into a side
buffer (MPI's unexpected queue) so that the ring keeps moving, and a later receive of that tag
takes it from there. A receive with `fold` reduces the message into its destination straight from
the slots (one pass fewer than landing it in scratch first). A message the sender left in its
shared tensor (`shared`) is read there, and acknowledged once read.
"""

from __future__ import annotations

import collections
import threading

import torch

from ringzero.comm.transport import regions
from ringzero.comm.transport.layout import REF
from ringzero.comm.transport.channel import Ring, copy


class _Recv:
    __slots__ = ("out", "tag", "done", "channel", "fold")

    def __init__(self, out: torch.Tensor, tag: int, channel: "Inbound", fold=None) -> None:
        self.out, self.tag, self.done, self.channel, self.fold = out, tag, False, channel, fold

    def take(self, lo: int, src: torch.Tensor) -> None:
        """Bytes [lo, lo + len(src)) of the message: copied into `out`, or with `fold` (a typed
        `out` and `dst = op(dst, src)`) reduced into it straight from the slot."""
        if self.fold is None:
            copy(self.out.data_ptr() + lo, src.data_ptr(), len(src))
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
        self.r: Ring | None = None
        self._attach = attach
        """Opens the sender's segment: called by the first wait, never by a post, since two ranks
        that each post a receive before a send would otherwise wait for each other's segment."""
        self.tail = self.slot = 0
        """The next entry and the next slot to read."""
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
        tag, n, k, at = r.read_header(self.tail)
        with self.lock:
            target = next((op for op in self.posted if op.tag == tag), None)
            if target is not None:
                self._fit(target, n)
                self.posted.remove(target)
        aside = torch.empty(n, dtype=torch.uint8) if target is None else None
        if k <= REF:                      # left in the sender's shared tensor: read it there
            self.tail += 1
            r.space.post()
            src = regions.theirs(r.peer_pid, REF - k)[at:at + n]
            if target is None:
                copy(aside.data_ptr(), src.data_ptr(), n)
            else:
                target.take(0, src)
            r.acks.post()
        else:
            self._read_slots(target, aside, n, k)
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

    def _read_slots(self, target: _Recv | None, aside: torch.Tensor | None, n: int, k: int) -> None:
        """A message copied through the channel: k bytes in the next slot, the rest in the ones after."""
        r, got = self.r, 0
        while True:
            if k:
                off = r.slot(self.slot)
                if target is None:
                    copy(aside.data_ptr() + got, r.base + off, k)
                else:
                    target.take(got, r.bytes[off:off + k])
                self.slot += 1
                r.bufs.post()
            got += k
            self.tail += 1
            r.space.post()
            if got >= n:
                return
            r.take(r.data)
            _, _, k, _ = r.read_header(self.tail)
