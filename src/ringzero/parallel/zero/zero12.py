"""ZeRO-1 and ZeRO-2: optimizer states (and gradients) sharded over the dp ranks (Rajbhandari et al.
2020 §5.1-5.2).

Each bucket is padded to a multiple of the ranks and reduce-scattered, so a rank ends the step with
the summed gradient of its own shard, updates only that shard, and all-gathers the updated weights
into every rank's full copy after the step. ZeRO-1 reduce-scatters on the last micro-batch only;
ZeRO-2 after every micro-batch, and frees the full gradient at once, so a rank holds gradient shards
only.
"""

from __future__ import annotations

from ringzero import comm
from ringzero.plan.strategies.sharding import ZERO1, ZERO2
from ringzero.parallel.flat_group import FlatGroup
from ringzero.parallel.flat_strategy import FlatStrategy
from ringzero.comm.kinds import kind


class ZeRO1(FlatStrategy):
    sharding = ZERO1

    def _reduce(self, g: FlatGroup) -> None:
        if self.topology.dp == 1:
            out = g.grad_flat.clone()
        elif self.comm_hook.active:         # `parallel.compression`: its shard of the hook's sum
            out = g.bucket.empty(shard=True)
            self.comm_hook.reduce(g, out)
        else:
            out = g.bucket.empty(shard=True)
            comm.reduce_scatter_tensor(out, g.grad_flat, op="sum", group=self.group,
                                       algorithm=self._algorithm("reduce_scatter"))
        g.add_reduced_shard(out)
        if self.sharding.shard_grads:
            g.grad_flat = None

    def after_step(self) -> None:
        """All-gather the updated shards into every rank's full weights (under the kind of the
        strategy's after-step gather)."""
        if not self.sharding.gathers_after_step or self.topology.dp == 1:
            return
        algo = self._algorithm("all_gather")
        with kind(self.sharding.weight_gathers[0].kind):
            for g in self.groups:
                b = g.bucket
                self.queue.submit(comm.all_gather_into_tensor, g.full, g.full[b.lo:b.hi].clone(),
                                  group=self.group, algorithm=algo)
        self.queue.drain()


class ZeRO2(ZeRO1):
    sharding = ZERO2
