"""The in-run probe of a gradient-compression hook's compute (`parallel.compression`): the hook's
own work on this rank's bucket layout (matmuls and orthogonalisation for PowerSGD, the selection
and scatter-add for top-k, the casts for fp16/bf16) with nothing sent (`LocalLink`), timed at the
probe points beside the block and the collectives, so the step-time twin prices it as it prices
them (`twin.step`).
"""

from __future__ import annotations

import time

import torch

from ringzero.parallel.compression.bucket import GradBucket, LocalLink

REPS = 3
"""Timed steps per probe point (median)."""


class CompressProbe:
    """A fresh copy of `strategy`'s hook over random buckets of its layout."""

    def __init__(self, strategy) -> None:
        self.hook = strategy.comm_hook.hook.fresh()
        self.link = LocalLink(strategy.topology.dp)
        sharded = strategy.sharding.shard_optimizer
        gen = torch.Generator().manual_seed(0)
        self.buckets = []
        for g in strategy.groups:
            b = g.bucket
            buf = torch.randn(b.padded, generator=gen).to(b.dtype)        # (padded,) a dense gradient
            shard = b.empty(shard=True) if sharded else None
            self.buckets.append((GradBucket(g.index, buf, b.offsets, b.shapes, shard if self.hook.scatters else None),
                                 shard, b))

    def _step(self) -> None:
        # LocalLink sums nothing and the hooks divide by the ranks, so repeated steps keep the
        # buffers' scale (no overflow however many reps)
        for bucket, shard, b in self.buckets:
            self.hook.reduce(bucket, self.link)
            if shard is not None and not self.hook.scatters:
                shard.copy_(bucket.buffer[b.lo:b.hi])
        self.hook.settle(False)

    def __call__(self) -> float:
        """Median seconds of one step's compression compute."""
        self._step()                          # first use (allocations, the first Q)
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            self._step()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
