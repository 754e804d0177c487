"""One flat bucket of parameters with its weights and gradients, its weights in an explicit state.

As FSDP2's `FSDPParamGroup` (its `ShardedState`), each group says where its weights are instead of
leaving `None` to stand for a state:

    FULL       the whole bucket is held and bound (DP, ZeRO-1/2: always)
    SHARDED    only this rank's shard is held (ZeRO-3 between uses)
    GATHERING  an all-gather of the bucket is in flight (ZeRO-3's prefetch)
    GATHERED   the gathered bucket is bound for a forward or backward (ZeRO-3)

Gradients live in `grad_flat` (this rank's, unreduced: DP sums into it in place) and `grad_shard`
(ZeRO: the reduced sum of this rank's shard, over ranks and micro-batches).
"""

from __future__ import annotations

from concurrent.futures import Future
from enum import Enum

import torch
from torch import nn

from ringzero.parallel.flat import FlatBucket


class Weights(Enum):
    FULL = "full"
    SHARDED = "sharded"
    GATHERING = "gathering"
    GATHERED = "gathered"


def nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


class FlatGroup:
    """Bucket `bucket` (index `index`; `root`: ZeRO-3's bucket of the parameters outside layers)."""

    def __init__(self, bucket: FlatBucket, index: int, root: bool = False) -> None:
        self.bucket, self.index, self.root = bucket, index, root
        self.weights = Weights.FULL
        self.full: torch.Tensor | None = bucket.gather_params()   # (padded,) bound to the parameters
        self.shard: torch.Tensor | None = None       # (shard,) ZeRO-3's own weights
        self.gathering: Future | None = None
        self.landing: torch.Tensor | None = None     # the all-gather's output while it is filled
        self.grad_flat: torch.Tensor | None = None   # (padded,) gradients of this rank
        self.grad_shard: torch.Tensor | None = None  # (shard,) reduced gradients of this rank's shard
        self.arrived = 0                             # parameters whose gradient this backward produced
        self.got: set[int] = set()                   # their slots (for the missing-gradient check)
        self.finite: bool | None = None              # whether grad_flat held no inf/NaN when reduced
        self.shared = False                          # reduced alike by ranks outside the dp group too

    @property
    def params(self) -> list[nn.Parameter]:
        return self.bucket.params

    # -- weights --------------------------------------------------------------------------------
    def bind_full(self) -> None:
        self.bucket.bind(self.full)
        self.weights = Weights.FULL

    def keep_shard(self) -> None:
        """FULL -> SHARDED: keep a copy of this rank's shard, drop the rest."""
        b = self.bucket
        self.shard = self.full[b.lo:b.hi].clone()
        self.release()

    def bind_gathered(self, full: torch.Tensor) -> None:
        """GATHERING -> GATHERED."""
        self.bucket.bind(full)
        self.full, self.landing, self.gathering = full, None, None
        self.weights = Weights.GATHERED

    def release(self) -> None:
        """-> SHARDED: the parameters lose their storage (the Parameter objects stay); an all-gather
        still in flight is waited for and dropped, so none is left to be issued twice."""
        if self.gathering is not None:
            self.gathering.result()
            self.gathering, self.landing = None, None
        self.bucket.unbind()
        self.full = None
        self.weights = Weights.SHARDED

    def owned_weights(self) -> torch.Tensor:
        """The weights this rank's optimizer updates: its shard, or the whole bucket when unsharded."""
        b = self.bucket
        return self.shard if self.shard is not None else self.full[b.lo:b.hi]

    # -- gradients ------------------------------------------------------------------------------
    def accumulate(self, i: int, p: nn.Parameter) -> None:
        """Add p.grad into slot i of the gradient flat, and drop it."""
        if self.grad_flat is None:
            self.grad_flat = self.bucket.empty()
        self.bucket.slot(i, self.grad_flat).add_(p.grad.reshape(-1))
        p.grad = None

    def bind_grads(self) -> None:
        """Make every parameter's .grad a view of its slot of the gradient flat, so autograd adds
        into the flat itself (DDP's gradient_as_bucket_view)."""
        if self.grad_flat is None:
            self.grad_flat = self.bucket.empty()
        for p, v in zip(self.params, self.bucket.views(self.grad_flat)):
            p.grad = v

    def add_reduced_shard(self, out: torch.Tensor) -> None:
        if self.grad_shard is None:
            self.grad_shard = out
        else:
            self.grad_shard.add_(out)

    def zero_grad(self) -> None:
        """Zero the accumulators in place (DDP keeps its buckets too: no reallocation)."""
        for t in (self.grad_flat, self.grad_shard):
            if t is not None:
                t.zero_()

    def missing(self) -> list[nn.Parameter]:
        return [p for i, p in enumerate(self.params) if i not in self.got]
