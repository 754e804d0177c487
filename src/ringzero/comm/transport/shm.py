"""A group's point-to-point over shared memory: `send`/`recv` as a gloo ProcessGroup takes them.

`ShmGroup(group)` stands where the algorithms' `TorchComm` and `point_to_point` used the group's
`ProcessGroup`: `send([t], peer, tag)` and `recv([t], peer, tag)` with group ranks, returning
handles with `wait()`. A message to a peer on this host (`hosts`) goes through the pair's channel
(`channel`), one segment per direction, set up the first time the pair talks: the sender creates
its outbound segment, the receiver opens it, checks it and unlinks its name (`segment`). A peer on
another host goes through the backend's ProcessGroup, unchanged (transport "auto"); transport
"shm" refuses such a pair.

Tensors travel as their bytes, so every dtype moves bit for bit and the algorithms' arithmetic is
the same on either transport.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref

import torch
import torch.distributed as dist

from ringzero.comm.transport import channel, hosts, layout, regions, segment
from ringzero.comm.transport.inbound import Inbound
from ringzero.comm.transport.outbound import Outbound

ATTACH_TIMEOUT_S = 60.0
"""How long a receiver waits for its sender's segment to appear (the sender may still be busy)."""


class NotLocal(RuntimeError):
    """Transport "shm" was asked for between ranks on different hosts."""


def _timeout_s(pg) -> float:
    """The group's own timeout (what gloo would give up after), 600 s if torch hides it."""
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:
        return 600.0


class ShmGroup:
    """ProcessGroup-like point-to-point for one group (module doc)."""

    def __init__(self, pg, require: bool) -> None:
        self._pg = weakref.ref(pg)
        """Weakly: `route` keeps this object by its group, and a strong reference back would keep the
        group (and gloo's threads) alive past `destroy_process_group`, into the interpreter's exit,
        where destroying it aborts the process."""
        self.require = require
        self.ranks = dist.get_process_group_ranks(pg)
        self.me = self.ranks.index(dist.get_rank())
        self.gid = hashlib.sha1(str(pg.group_name).encode()).hexdigest()[:8]
        self.timeout_s = _timeout_s(pg)
        self._local: dict[int, bool] = {}
        self._out: dict[int, Outbound] = {}
        self._in: dict[int, Inbound] = {}
        self._lock = threading.Lock()

    def local(self, peer: int) -> bool:
        """Whether group rank `peer` shares this host's memory."""
        got = self._local.get(peer)
        if got is None:
            host, _ = hosts.peer(self.ranks[peer])
            got = self._local[peer] = host == hosts.host_id()
            if not got and self.require:
                raise NotLocal(f"transport shm: rank {self.ranks[peer]} is on another host than rank "
                               f"{self.ranks[self.me]}; use transport auto or gloo")
        return got

    def send(self, tensors, peer: int, tag: int):
        (t,) = tensors
        if not self.local(peer):
            return self._pg().send(tensors, peer, tag)
        data = _bytes(t)
        return self._outbound(peer).send(data, tag, regions.find(data.data_ptr(), len(data), self.ranks[peer]))

    def recv(self, tensors, peer: int, tag: int):
        (t,) = tensors
        if not self.local(peer):
            return self._pg().recv(tensors, peer, tag)
        return self._inbound(peer).recv(_bytes(t), tag)

    def recv_reduce(self, tensors, peer: int, tag: int, fold):
        """A receive from a peer of this host whose message is reduced into `tensors[0]` straight
        from the channel's slots, `fold(dst, src)` (one copy fewer than receive, then reduce)."""
        (t,) = tensors
        if not t.is_contiguous():
            raise ValueError("shared-memory messages must be contiguous tensors")
        return self._inbound(peer).recv(t.reshape(-1), tag, fold)

    def recv_anysource(self, tensors, tag: int):
        return self._pg().recv_anysource(tensors, tag)

    def _name(self, src: int, dst: int, creator_pid: int) -> str:
        return segment.name(hosts.token(), creator_pid, self.gid, self.ranks[src], self.ranks[dst])

    def _once(self, table: dict, peer: int, make):
        """`table[peer]`, made by `make(peer)` the first time (once, whichever thread asks first)."""
        got = table.get(peer)
        if got is None:
            with self._lock:
                got = table.get(peer)
                if got is None:
                    got = table[peer] = make(peer)
        return got

    def _outbound(self, peer: int) -> Outbound:
        return self._once(self._out, peer, self._create)

    def _inbound(self, peer: int) -> Inbound:
        return self._once(self._in, peer, lambda p: Inbound(lambda: self._attach(p)))

    def _create(self, peer: int) -> Outbound:
        """Make this rank's segment toward `peer`, filled before it gets its name (`segment.create`)."""
        mm = segment.create(self._name(self.me, peer, os.getpid()), layout.segment_bytes(),
                            lambda m: channel.init_header(m, layout.SLOTS, layout.SLOT_BYTES, os.getpid(), layout.ENTRIES))
        _, pid = hosts.peer(self.ranks[peer])
        return Outbound(channel.ring(mm, f"rank {self.ranks[peer]}", pid, self.timeout_s))

    def _attach(self, peer: int) -> channel.Ring:
        """Open the peer's outbound segment to this rank, check it, unlink its name."""
        _, pid = hosts.peer(self.ranks[peer])
        seg, size = self._name(peer, self.me, pid), layout.segment_bytes()
        deadline, pause = time.monotonic() + ATTACH_TIMEOUT_S, 1e-4
        while True:
            mm = segment.attach(seg, size)
            if mm is not None:
                if not channel.ready(mm):
                    raise segment.Refused(f"{segment.DIR}/{seg} is not a ringzero channel")
                break
            if not segment.alive(pid):
                raise RuntimeError(f"rank {self.ranks[peer]} (pid {pid}) exited before its shared-memory "
                                   f"channel to rank {self.ranks[self.me]} was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {self.ranks[peer]} made no shared-memory channel to rank "
                                   f"{self.ranks[self.me]} within {ATTACH_TIMEOUT_S:.0f} s")
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
        segment.unlink(seg)
        return channel.ring(mm, f"rank {self.ranks[peer]}", pid, self.timeout_s)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes as a 1-D uint8 view (the algorithms' buffers are contiguous)."""
    if t.dim() == 1 and t.stride(0) == 1:
        flat = t
    elif t.is_contiguous():
        flat = t.reshape(-1)
        if flat.stride(0) != 1:         # one element of a strided view: contiguous, any stride
            flat = flat.as_strided(flat.shape, (1,))
    else:
        raise ValueError("shared-memory messages must be contiguous tensors")
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
