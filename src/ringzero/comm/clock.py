"""Each rank's clock against its group's first rank: the common anchor a merged trace aligns on.

Cristian's algorithm (Cristian 1989, "Probabilistic clock synchronization"), as NTP does it: the
first rank reads its clock (t0), sends to rank r, which answers with its own reading (tr); the
first rank reads again on the answer (t1). Then r's clock is ahead by tr - (t0 + t1) / 2, give or
take half the round trip (t1 - t0) / 2, the bound on the error. Of `ROUNDS` tries the one with the
shortest round trip is kept: a try that a descheduled process delayed only widens its own bound.

Taken at the start and at the end of the traced steps, the two offsets also give the drift between
them; on one host every rank reads the same clock and the offsets measure only the method's error.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

ROUNDS = 8
TAG = 47
"""The messages' tag when the ranks are `members` of a larger group (a parameter server's workers,
beside the servers' own tags)."""


def _taking_part(group, members: list[int] | None) -> tuple[list[int], torch.device]:
    """The global ranks that take part (`group`'s, or its `members` only) and the device their
    messages live on (NCCL's: the current GPU)."""
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    ranks = [ranks[m] for m in members] if members is not None else ranks
    nccl = dist.get_backend(group) == "nccl"
    return ranks, torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def offsets(group=None, members: list[int] | None = None) -> list[dict]:
    """For every rank of `group` (in group order; a collective call, every member calls it), or of
    its `members` only (group ranks; they alone call it): {"offset_s": its clock minus the first
    rank's, "error_s": the bound, half the shortest round trip}. The first rank's is 0, 0. Without a
    process group: one rank, itself."""
    if not dist.is_initialized():
        return [{"offset_s": 0.0, "error_s": 0.0}]
    ranks, device = _taking_part(group, members)
    tag = TAG if members is not None else 0
    me = dist.get_rank()
    buf = torch.zeros(2, dtype=torch.float64, device=device)
    out = [{"offset_s": 0.0, "error_s": 0.0} for _ in ranks]
    for i, peer in enumerate(ranks[1:], start=1):
        if me == ranks[0]:
            best = None
            for _ in range(ROUNDS):
                t0 = time.time()
                dist.send(buf, peer, group=group, tag=tag)
                dist.recv(buf, peer, group=group, tag=tag)
                t1 = time.time()
                tr = float(buf[0])
                if best is None or t1 - t0 < best[1] - best[0]:
                    best = (t0, t1, tr)
            t0, t1, tr = best
            out[i] = {"offset_s": tr - (t0 + t1) / 2, "error_s": (t1 - t0) / 2}
        elif me == peer:
            for _ in range(ROUNDS):
                dist.recv(buf, ranks[0], group=group, tag=tag)
                buf[0] = time.time()
                dist.send(buf, ranks[0], group=group, tag=tag)
    flat = torch.tensor([v for o in out for v in (o["offset_s"], o["error_s"])], dtype=torch.float64, device=device)
    if members is None:
        dist.broadcast(flat, ranks[0], group=group)
    elif me == ranks[0]:
        for peer in ranks[1:]:
            dist.send(flat, peer, group=group, tag=tag)
    else:
        dist.recv(flat, ranks[0], group=group, tag=tag)
    return [{"offset_s": float(flat[2 * i]), "error_s": float(flat[2 * i + 1])} for i in range(len(ranks))]


def meet(group=None, members: list[int] | None = None) -> None:
    """Return on every rank of `group` (or of its `members` only, as `offsets`) once all have
    called it: a barrier, over the members alone when the group holds others (a parameter
    server's servers, which serve meanwhile and never call it)."""
    if not dist.is_initialized():
        return
    if members is None:
        dist.barrier(group=group)
        return
    ranks, device = _taking_part(group, members)
    token = torch.zeros(1, device=device)
    if dist.get_rank() == ranks[0]:          # every member has arrived before the first lets any go
        for peer in ranks[1:]:
            dist.recv(token, peer, group=group, tag=TAG)
        for peer in ranks[1:]:
            dist.send(token, peer, group=group, tag=TAG)
    else:
        dist.send(token, ranks[0], group=group, tag=TAG)
        dist.recv(token, ranks[0], group=group, tag=TAG)
