"""Every replica starts from the same weights: the first rank's parameters and buffers broadcast
to every rank of the group before anything splits, cuts or shards the model.

torch's DistributedDataParallel does the same at construction (its module states are broadcast from
rank 0) and so does DeepSpeed's engine. Without it, ranks that built the model from different
seeds, or loaded different files, train apart without an error: data parallelism averages the
gradients of different models and keeps them different, and BatchNorm's running statistics drift
on each rank alone. Broadcasting before tensor parallelism splits the linears keeps the slices of
one weight from one rank's copy, so the split model is a split of one model.

Tensors go flattened by dtype and device, in buckets of at most `BUCKET_BYTES`, through the
backend's own broadcast: it happens once, outside every step, so no meter counts it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

BUCKET_BYTES = 256 * 2**20
"""Bytes per broadcast (DDP broadcasts its module states in 250 MB buckets)."""


def _states(module: nn.Module) -> list[torch.Tensor]:
    """The module's parameters and buffers, each once (a tied weight is one tensor)."""
    seen, out = set(), []
    for t in (*module.parameters(), *module.buffers()):
        if id(t) not in seen and not t.is_meta:
            seen.add(id(t))
            out.append(t)
    return out


def _buckets(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """`tensors` grouped by (dtype, device), each group cut into runs of at most `limit` bytes (a
    larger tensor goes alone)."""
    runs: dict[tuple, list[list[torch.Tensor]]] = {}
    size: dict[tuple, int] = {}
    for t in tensors:
        key, n = (t.dtype, t.device), t.numel() * t.element_size()
        if key not in runs or size[key] + n > limit:
            runs.setdefault(key, []).append([])
            size[key] = 0
        runs[key][-1].append(t)
        size[key] += n
    return [run for kind in runs.values() for run in kind]


@torch.no_grad()
def broadcast_module(module: nn.Module, group=None, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Make every rank of `group` (default: the whole job) hold the first rank's parameters and
    buffers of `module`, in place (a collective: every rank of `group` calls it). Nothing happens
    without a process group or on a group of one rank."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    src = dist.get_global_rank(group, 0) if group is not None else 0
    for run in _buckets(_states(module), bucket_bytes):
        flat = torch.cat([t.detach().reshape(-1) for t in run])
        dist.broadcast(flat, src=src, group=group)
        at = 0
        for t in run:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()
