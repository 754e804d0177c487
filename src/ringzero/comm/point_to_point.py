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

Every message is counted by the traffic meter under "send_recv/p2p": bytes and messages each way,
one call per `post`.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from .meter import active_entries, add

KEY = "send_recv/p2p"


def post(sends: Sequence[tuple[int, torch.Tensor]] = (), recvs: Sequence[tuple[int, torch.Tensor]] = (),
         group=None, tag: int = 0) -> tuple[list, list]:
    """Post `sends` and `recvs` [(group peer, contiguous tensor)] at once; returns (send handles,
    receive handles), each with `wait()`."""
    for _, t in (*sends, *recvs):
        if not t.is_contiguous():
            raise ValueError("point-to-point tensors must be contiguous")
    me, n = dist.get_rank(group), dist.get_world_size(group)
    for peer, _ in (*sends, *recvs):
        if not 0 <= peer < n or peer == me:
            raise ValueError(f"rank {me} addressed peer {peer} in a group of {n}")
    meters = active_entries(KEY)
    add(meters, calls=1, bytes_sent=sum(t.numel() * t.element_size() for _, t in sends),
        bytes_recv=sum(t.numel() * t.element_size() for _, t in recvs),
        messages_sent=len(sends), messages_recv=len(recvs), rounds=1)
    if dist.get_backend(group) == "nccl":
        glob = dist.get_global_rank if group is not None else (lambda g, r: r)
        ops = [dist.P2POp(dist.isend, t, glob(group, p), group=group, tag=tag) for p, t in sends]
        ops += [dist.P2POp(dist.irecv, t, glob(group, p), group=group, tag=tag) for p, t in recvs]
        # One NCCL group: its handles complete together, so all of them are the receives' to wait on.
        return [], dist.batch_isend_irecv(ops) if ops else []
    pg = group if group is not None else dist.group.WORLD
    return ([pg.send([t], p, tag) for p, t in sends], [pg.recv([t], p, tag) for p, t in recvs])
