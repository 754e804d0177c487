"""Data parallelism: every rank keeps the whole model and all-reduces its gradients (Li et al. 2020).

Each bucket is all-reduced once per step, on the last micro-batch, as soon as its last gradient has
arrived (DDP's overlap of communication with backward); the sum is averaged by the optimizer. A
registered communication hook (`parallel.compression`) reduces the bucket instead.

The gradient buckets live in shared memory that the other ranks of this host have mapped
(`comm.transport.shared`, made once at construction: collective, the same buckets on every
rank), so the all-reduce's messages between them travel by reference, without a copy into the
transport's slots (NCCL's registered buffers). Under transport gloo, or on a GPU, they are plain
tensors.
"""

from __future__ import annotations

from ringzero import comm
from ringzero.comm.transport import shared
from ringzero.plan.strategies.sharding import DP
from ringzero.parallel.flat_group import FlatGroup
from ringzero.parallel.flat_strategy import FlatStrategy


class DataParallel(FlatStrategy):
    sharding = DP

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.topology.dp > 1:
            for g in self.groups:
                b = g.bucket
                if b.device.type == "cpu":
                    g.grad_flat = shared.zeros(b.padded, b.dtype, self.group)

    def _reduce(self, g: FlatGroup) -> None:
        if self.comm_hook.active:
            self.comm_hook.reduce(g)
        elif self.topology.dp > 1:     # one rank: the sum is the gradient (and no group is needed)
            comm.all_reduce(g.grad_flat, op="sum", group=self.group, algorithm=self._algorithm("all_reduce"))
