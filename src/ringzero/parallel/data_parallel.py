"""Data parallelism: every rank keeps the whole model and all-reduces its gradients (Li et al. 2020).

Each bucket is all-reduced once per step, on the last micro-batch, as soon as its last gradient has
arrived (DDP's overlap of communication with backward); the sum is averaged by the optimizer. A
registered communication hook (`parallel.compression`) reduces the bucket instead.
"""

from __future__ import annotations

from ringzero import comm
from ringzero.plan.strategies.sharding import DP
from ringzero.parallel.flat_group import FlatGroup
from ringzero.parallel.flat_strategy import FlatStrategy


class DataParallel(FlatStrategy):
    sharding = DP

    def _reduce(self, g: FlatGroup) -> None:
        if self.comm_hook.active:
            self.comm_hook.reduce(g)
        elif self.topology.dp > 1:     # one rank: the sum is the gradient (and no group is needed)
            comm.all_reduce(g.grad_flat, op="sum", group=self.group, algorithm=self._algorithm("all_reduce"))
