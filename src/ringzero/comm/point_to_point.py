"""Metered point-to-point messages between two ranks of a group: what pipeline stages exchange.

    works = post(sends=[(peer, tensor)], recvs=[(peer, tensor)], group=g, tag=ACTIVATIONS)

Peers are group ranks, as in every `ringzero.comm` call. All messages of one call are posted
together and nothing is waited on: the caller waits on the handles it needs (a receive before
using its tensor; sends before the step ends). Posting a send with the receive it precedes is how
pipeline stages avoid the classic deadlocks (Megatron-LM's send_forward_recv_backward): on NCCL the
call is one `batch_isend_irecv` group, since separately issued NCCL sends and receives serialise on
the stream, and two stages that each send before they receive wait for each other forever; on gloo
sends and receives are truly asynchronous and go straight to the group's ProcessGroup.

`tag` keeps two streams between the same pair of ranks apart (activations forward and gradients
backward both travel from the last stage to the first under the interleaved schedule); gloo
matches messages by (peer, tag) in posting order. NCCL has no tags: there the order of posting on
both sides is the match, which the pipeline schedules keep (every stage runs its forwards, and its
backwards, in one global order).

Every message is counted by the traffic meter under "send_recv/p2p": bytes and messages each way
(with the bytes that cross nodes, by the peer's global rank), one call per `post`. While a
`comm.timeline.Timeline` is open each post is also a record there (`Timeline.p2p`, of the current
`comm.kinds` kind, "pp" by default), ended when the last of its handles has been waited for. Under the link
emulator (`CommConfig.inter_node_gbps`) the receives and intra-node sends are posted first, then
each inter-node send once the emulated link has delivered it (`link_emulator`).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Sequence

import torch
import torch.distributed as dist

from ringzero.comm import kinds, link_emulator, timeline, transport
from ringzero.comm.config import get_config
from ringzero.comm.meter import active_entries, add
from ringzero.comm.p2p import cross_flags
from ringzero.comm.protocol import Handle
from ringzero.plan.comm.volume import FIELDS

KEY = "send_recv/p2p"


def post(sends: Sequence[tuple[int, torch.Tensor]] = (), recvs: Sequence[tuple[int, torch.Tensor]] = (),
         group=None, tag: int = 0, key: str = KEY, backend: bool = False) -> tuple[list[Handle], list[Handle]]:
    """Post `sends` and `recvs` [(group peer, contiguous tensor)] at once; returns (send handles,
    receive handles), each with `wait()`. `key`: the meter's entry the bytes count under;
    `backend`: through the backend's point-to-point whatever the transport (messages a `recv_any`
    will take, which only the backend has)."""
    for _, t in (*sends, *recvs):
        if not t.is_contiguous():
            raise ValueError("point-to-point tensors must be contiguous")
    me, n, _ = _facts(group)
    for peer, _ in (*sends, *recvs):
        if not 0 <= peer < n or peer == me:
            raise ValueError(f"rank {me} addressed peer {peer} in a group of {n}")
    meters = active_entries(key)
    rec = _record(group, n, sends, recvs, tag) if timeline.OPEN else None
    cfg = get_config()
    link = link_emulator.link_for(cfg)
    cross = _cross(group, me, n, cfg.world_node_size()) if meters or rec or link is not None else None
    if meters or rec:
        _count(meters + ([rec.counts] if rec else []), sends, recvs, cross)
    works, received = _post(sends, recvs, group, tag, link, cross, backend)
    if rec is None:
        return works, received
    return [_Tracked(w, rec) for w in works], [_Tracked(w, rec) for w in received]


_FACTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _facts(group) -> tuple[int, int, bool]:
    """(this rank, size, NCCL?) of `group`, read once per group: a pipeline posts thousands of
    messages a step, and torch's lookups cost more than a shared-memory hand-off."""
    pg = group if group is not None else dist.group.WORLD
    got = _FACTS.get(pg)
    if got is None:
        got = _FACTS[pg] = (dist.get_rank(group), dist.get_world_size(group), dist.get_backend(group) == "nccl")
    return got


def _post(sends, recvs, group, tag: int, link, cross, backend: bool = False) -> tuple[list[Handle], list[Handle]]:
    far = [] if link is None or cross is None else [(p, t) for p, t in sends if cross[p]]
    if far:
        sends = [(p, t) for p, t in sends if not cross[p]]
    glob = dist.get_global_rank if group is not None else (lambda g, r: r)
    if _facts(group)[2]:
        for p, t in far:  # one NCCL group: hold it until the last inter-node message has arrived
            link_emulator.transmit(link, _nbytes(t), glob(group, p))
        ops = [dist.P2POp(dist.isend, t, glob(group, p), group=group, tag=tag) for p, t in [*sends, *far]]
        ops += [dist.P2POp(dist.irecv, t, glob(group, p), group=group, tag=tag) for p, t in recvs]
        # One NCCL group: its handles complete together, so all of them are the receives' to wait on.
        return [], dist.batch_isend_irecv(ops) if ops else []
    first = (sends or recvs)[0][1] if (sends or recvs) else None
    device = first.device if first is not None and first.is_cuda else None
    pg = (group if group is not None else dist.group.WORLD) if backend else transport.p2p(group, device)
    works = [pg.send([t], p, tag) for p, t in sends]
    received = [pg.recv([t], p, tag) for p, t in recvs]
    works += [link_emulator.send_later(link, _nbytes(t), lambda p=p, t=t: pg.send([t], p, tag), glob(group, p))
              for p, t in far]
    return works, received


def _record(group, n: int, sends, recvs, tag: int) -> timeline.CallRecord:
    """A post's record on the open timelines: its peers (global ranks) and bytes each way."""
    glob = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    kind = kinds.current()
    rec = timeline.CallRecord("send_recv", tuple(glob(r) for r in range(n)), -1, time.time(), algorithm="p2p",
                              bytes=sum(_nbytes(t) for _, t in (*sends, *recvs)), beside=False,
                              kind="pp" if kind == "other" else kind, thread=threading.current_thread().name,
                              counts=[0] * len(FIELDS), detail={"sends": [[glob(p), _nbytes(t)] for p, t in sends],
                                                                "recvs": [[glob(p), _nbytes(t)] for p, t in recvs],
                                                                "tag": tag})
    timeline.add("p2p", rec)
    return rec


class _Tracked:
    """A handle that marks its post's record done when waited for (the last wait ends it)."""

    def __init__(self, work, rec: timeline.CallRecord) -> None:
        self.work, self.rec = work, rec

    def wait(self, *args):
        out = self.work.wait(*args)
        self.rec.end, self.rec.state = time.time(), "completed"
        return out

    def __getattr__(self, name: str):
        return getattr(self.work, name)


def _count(meters, sends, recvs, cross) -> None:
    """One call of messages `sends` and `recvs` on every open meter; `cross[p]`: peer p is on
    another node (None: one node, no cross-node bytes)."""
    deltas = dict(calls=1, bytes_sent=sum(_nbytes(t) for _, t in sends),
                  bytes_recv=sum(_nbytes(t) for _, t in recvs),
                  messages_sent=len(sends), messages_recv=len(recvs), rounds=1)
    if cross is not None:
        deltas["cross_node_bytes_sent"] = sum(_nbytes(t) for p, t in sends if cross[p])
        deltas["cross_node_bytes_recv"] = sum(_nbytes(t) for p, t in recvs if cross[p])
    add(meters, **deltas)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _cross(group, me: int, n: int, ranks_per_node: int | None):
    """`p2p.cross_flags` of this group (None: one node)."""
    if ranks_per_node is None:
        return None
    ranks = dist.get_process_group_ranks(group) if group is not None else range(n)
    return cross_flags(ranks, me, ranks_per_node)


def recv_any(t: torch.Tensor, group=None, tag: int = 0, key: str = KEY) -> int:
    """Receive `t` from whichever rank of `group` sends to this one first with `tag`, and return that
    rank (a group rank). It blocks without spinning (gloo's any-source receive), so a parameter
    server serves its workers in the order their pushes arrive. NCCL has no any-source receive."""
    if not t.is_contiguous():
        raise ValueError("point-to-point tensors must be contiguous")
    if dist.get_backend(group) == "nccl":
        raise ValueError("a receive from any rank needs gloo: NCCL has none")
    pg = group if group is not None else dist.group.WORLD
    work = pg.recv_anysource([t], tag)
    work.wait()
    src = work._source_rank()
    meters = active_entries(key)
    if meters:
        me, n = dist.get_rank(group), dist.get_world_size(group)
        _count(meters, (), [(src, t)], _cross(group, me, n, get_config().world_node_size()))
    return src
