"""The point-to-point layer every algorithm is written against.

An algorithm sees a `Comm`: its group rank and size, `exchange` (post sends and receives of 1-D
buffers, wait later), `reduce` (in-place elementwise op), `copy` and `empty`. `TorchComm` runs it on
`torch.distributed` point-to-point; `ringzero.comm.explain` runs the very same algorithm code on
symbolic buffers to print who sends what to whom. Nothing else in an algorithm touches torch.

Deadlock freedom: all sends and receives of one step are posted together before any is waited on.
On NCCL they go through `batch_isend_irecv` (one NCCL group), because separately issued NCCL
send/recv calls serialise on the stream and a ring of them deadlocks (seen at 4 and 8 ranks). Gloo's
sends and receives are truly asynchronous, so there they are posted one by one on the group's
`ProcessGroup` (`send`/`recv` with group ranks, what `dist.isend` calls after its checks), and the
pipelined ring posts each message on its own (`post_send`, `post_recv`).
Every message is counted by the traffic meter, its bytes split between intra- and inter-node links
by the peer's global rank (`cross_flags`); with `CommConfig.inter_node_gbps` set, a send to another
node is posted only once the emulated inter-node link has delivered it (`link_emulator`).
Messages between one pair of ranks are matched in posting order, so every algorithm posts them in
the same order on both sides. Zero-length messages are never sent; both sides skip them because
both know the chunk sizes.
"""

from __future__ import annotations

import threading
from typing import Sequence

import torch
import torch.distributed as dist

from ringzero.comm import link_emulator, transport
from ringzero.comm.config import get_config
from ringzero.comm.meter import active_entries, add
from ringzero.comm.ops import Op, reducer


_ARENAS = threading.local()
"""Each thread's scratch arenas, by (dtype, device): tensor parallelism runs collectives on the
compute thread while the data-parallel ones run on the communication thread, each with its own."""


def reserve(dtype: torch.dtype, device, n: int) -> None:
    """Make this thread's scratch arena for (dtype, device) at least `n` elements now. A caller that
    knows the most scratch its next calls take (`ringzero bench comm`, per cell) sizes it once: an
    arena grown inside a call holds the old one and the new one together until the call returns.
    The pages are touched only as calls use them."""
    arenas, key = _ARENAS.__dict__, (dtype, torch.device(device))
    if arenas.get(key) is None or arenas[key].numel() < n:
        arenas.pop(key, None)                 # freed before the larger one is made
        arenas[key] = torch.empty(n, dtype=dtype, device=device)


class Pending:
    """Posted messages; `wait()` blocks until all have completed, receives first: over shared
    memory a receive moves its data only while it is waited for (`comm.transport.channel`), so two
    ranks that each waited for a send the other must first drain would wait for ever."""

    __slots__ = ("_works",)

    def __init__(self, works) -> None:
        self._works = works

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = ()


class TorchComm:
    """One collective call's view of a process group over `torch.distributed`."""

    def __init__(self, group, dtype: torch.dtype, device: torch.device, op: Op, key: str,
                 ranks_per_node: int | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.dtype, self.device = dtype, device
        self.itemsize = dtype.itemsize
        self.ranks_per_node = ranks_per_node
        self._reduce = reducer(op)
        self._global = dist.get_process_group_ranks(group) if group is not None else None
        # Gloo point-to-point goes straight to the group's ProcessGroup, which takes group ranks:
        # `dist.isend`'s argument checks and rank translation cost more than the call itself.
        self._batched = dist.get_backend(group) == "nccl"
        self._pg = group if group is not None else dist.group.WORLD
        if not self._batched:       # shared memory between ranks of one host (`comm.transport`)
            self._pg = transport.p2p(self._pg, device)
        self.async_p2p = not self._batched  # see ring.py: NCCL serialises separate p2p calls
        self._meters = active_entries(key)
        self._arena_used = 0
        add(self._meters, calls=1)
        cfg = get_config()
        self._arena_max = cfg.arena_max_bytes
        self._link = link_emulator.link_for(cfg)
        # Per group rank: is that peer on another node? Only built when someone will ask.
        self._cross = None
        if self._meters or self._link is not None:
            ranks = self._global if self._global is not None else range(self.size)
            self._cross = cross_flags(ranks, self.rank, cfg.world_node_size())
        if not any(self._cross or ()):
            self._link = None  # the group sits in one node: nothing to delay

    def _check(self, r: int) -> int:
        if not 0 <= r < self.size or r == self.rank:
            raise RuntimeError(f"internal: rank {self.rank} addressed peer {r} in a group of {self.size}")
        return r

    def _peer(self, r: int) -> int:
        self._check(r)
        return self._global[r] if self._global is not None else r

    def empty(self, n: int) -> torch.Tensor:
        """Scratch for this call, carved from a per-(dtype, device) arena kept across calls.

        A fresh multi-MiB tensor costs a page fault per 4 KiB on first touch (a 64 MiB clone took
        ~100 ms here, more than the all-reduce itself: `python -m timeit -n 5 -s "import torch;
        t = torch.randn(16 * 2**20)" "t.clone()"` against `ringzero bench comm --nproc 4
        --collective all_reduce --sizes 64MiB`), so collectives reuse one arena; it grows
        to the largest scratch any call needed (up to `CommConfig.arena_max_bytes` a request). One
        collective runs at a time per thread.
        """
        if self._arena_max is not None and n * self.itemsize > self._arena_max:
            return torch.empty(n, dtype=self.dtype, device=self.device)
        start, self._arena_used = self._arena_used, self._arena_used + n
        key = (self.dtype, self.device)
        arenas = _ARENAS.__dict__
        arena = arenas.get(key)
        if arena is None or arena.numel() < self._arena_used:
            # Grow (the old arena's slices handed out earlier in this call stay valid: they keep it alive).
            arena = arenas[key] = torch.empty(max(self._arena_used, 2 * (arena.numel() if arena is not None else 0)),
                                              dtype=self.dtype, device=self.device)
            start, self._arena_used = 0, n
        return arena[start:start + n]

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]] = (),
                 recvs: Sequence[tuple[int, torch.Tensor]] = (), new_round: bool = True) -> Pending:
        """Post `sends` [(peer, buf)] and `recvs` [(peer, buf)] at once; return a handle to wait on."""
        sends = [(p, b) for p, b in sends if b.numel()]
        recvs = [(p, b) for p, b in recvs if b.numel()]
        if not sends and not recvs:
            return Pending(())
        self._count(sends, recvs, new_round)
        if self._link is not None:
            return self._exchange_emulated(sends, recvs)
        if self._batched:
            ops = [dist.P2POp(dist.isend, b, self._peer(p), group=self.group) for p, b in sends]
            ops += [dist.P2POp(dist.irecv, b, self._peer(p), group=self.group) for p, b in recvs]
            return Pending(dist.batch_isend_irecv(ops))
        works = [self._pg.send([b], self._check(p), 0) for p, b in sends]
        works += [self._pg.recv([b], self._check(p), 0) for p, b in recvs]
        return Pending(works[len(sends):] + works[:len(sends)])

    def _exchange_emulated(self, sends, recvs) -> Pending:
        """`exchange` under the link emulator: intra-node sends and every receive are posted at
        once, each inter-node send by the NIC thread once the emulated link has delivered it, in
        order. Only messages to different peers change places, so the per-pair order that matches
        them stays."""
        cross = self._cross
        far = [(p, b) for p, b in sends if cross[self._check(p)]]
        near = [(p, b) for p, b in sends if not cross[p]]
        if self._batched:  # one NCCL group: hold it all until the last inter-node message arrives
            for p, b in far:
                link_emulator.transmit(self._link, b.numel() * self.itemsize, self._peer(p))
            ops = [dist.P2POp(dist.isend, b, self._peer(p), group=self.group) for p, b in near + far]
            ops += [dist.P2POp(dist.irecv, b, self._peer(p), group=self.group) for p, b in recvs]
            return Pending(dist.batch_isend_irecv(ops))
        works = [self._pg.send([b], p, 0) for p, b in near]
        works = [self._pg.recv([b], self._check(p), 0) for p, b in recvs] + works
        works += [link_emulator.send_later(self._link, b.numel() * self.itemsize,
                                           lambda p=p, b=b: self._pg.send([b], p, 0), self._peer(p))
                  for p, b in far]
        return Pending(works)

    def post_send(self, peer: int, buf: torch.Tensor, new_round: bool = False):
        """Post one non-empty send on an async backend; returns a handle with `wait()`. Under the
        link emulator an inter-node send is posted once the emulated link has delivered it."""
        self._count(((peer, buf),), (), new_round)
        if self._link is not None and self._cross[self._check(peer)]:
            return link_emulator.send_later(self._link, buf.numel() * self.itemsize,
                                            lambda: self._pg.send([buf], peer, 0), self._peer(peer))
        return self._pg.send([buf], self._check(peer), 0)

    def post_recv(self, peer: int, buf: torch.Tensor, new_round: bool = False):
        """Post one non-empty receive on an async backend; returns a handle with `wait()`."""
        self._count((), ((peer, buf),), new_round)
        return self._pg.recv([buf], self._check(peer), 0)

    def post_recv_reduce(self, peer: int, dst: torch.Tensor, scratch: torch.Tensor, new_round: bool = False):
        """Post one non-empty receive whose message is reduced into `dst` when waited for:
        `reduce(dst, message)`. Over shared memory straight from the channel's slots (`scratch`
        unused); otherwise received into `scratch` (as long as `dst`) and then reduced."""
        self._count((), ((peer, dst),), new_round)
        fold = getattr(self._pg, "recv_reduce", None)
        if fold is not None and self._pg.local(self._check(peer)):
            add(self._meters, bytes_reduced=dst.numel() * self.itemsize)
            return fold([dst], peer, 0, self._reduce)
        return _ThenReduce(self._pg.recv([scratch], self._check(peer), 0), self, dst, scratch)

    @staticmethod
    def split(buf: torch.Tensor, sizes: list[int]):
        """Views of consecutive pieces of `buf` (one call, however many pieces)."""
        return buf.split(sizes)

    def sendrecv(self, sends=(), recvs=(), new_round: bool = True) -> None:
        """`exchange(...).wait()`: one blocking step."""
        self.exchange(sends, recvs, new_round).wait()

    def reduce(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst = op(dst, src), elementwise and in place."""
        if dst.numel():
            self._reduce(dst, src)
            add(self._meters, bytes_reduced=dst.numel() * self.itemsize)

    @staticmethod
    def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.numel():
            dst.copy_(src)

    def _count(self, sends, recvs, new_round: bool) -> None:
        if not self._meters:
            return
        k = self.itemsize
        deltas = dict(bytes_sent=sum(b.numel() for _, b in sends) * k,
                      bytes_recv=sum(b.numel() for _, b in recvs) * k, messages_sent=len(sends),
                      messages_recv=len(recvs), rounds=1 if new_round else 0)
        cross = self._cross
        if cross is not None:
            deltas["cross_node_bytes_sent"] = sum(b.numel() for p, b in sends if cross[p]) * k
            deltas["cross_node_bytes_recv"] = sum(b.numel() for p, b in recvs if cross[p]) * k
        add(self._meters, **deltas)


class _ThenReduce:
    """A receive into scratch, reduced into its destination once it has arrived."""

    __slots__ = ("work", "comm", "dst", "scratch")

    def __init__(self, work, comm: TorchComm, dst: torch.Tensor, scratch: torch.Tensor) -> None:
        self.work, self.comm, self.dst, self.scratch = work, comm, dst, scratch

    def wait(self) -> None:
        self.work.wait()
        self.comm.reduce(self.dst, self.scratch)


def cross_flags(ranks: Sequence[int], rank: int, ranks_per_node: int | None) -> tuple[bool, ...] | None:
    """For each group rank, whether it sits on another node than group rank `rank`; None when the
    world is one node. `ranks[i]` is group rank i's global rank; the node of global rank g is
    g // ranks_per_node (`CommConfig.world_node_size`)."""
    if ranks_per_node is None:
        return None
    mine = ranks[rank] // ranks_per_node
    return tuple(g // ranks_per_node != mine for g in ranks)
