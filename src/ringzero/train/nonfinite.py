"""Non-finite gradients: skipped steps, where they came from, and when to stop.

A step whose global gradient norm is not finite is skipped on every rank (the norm is summed over
every rank, so all of them see it: `parallel.optimizer.ShardedAdam.step`). With fp16 that is the
loss scaler's signal to back off (Micikevicius et al. 2018 §3.2) and training goes on. With bf16 or
fp32 there is no scale to lower: the step is counted, and after `max_nonfinite` such steps in a row
the run stops with one line naming the step and the ranks whose own gradient was not finite
before it was reduced (each rank checks its buckets as it reduces them: `FlatStrategy.nonfinite`).
`inject_nonfinite` (rank, step) puts an inf into that rank's first bucket at that step, on purpose.
Under a parameter server the servers skip and count (`parallel.ps.server`), and a worker's own
gradient is the one whose norm in its push header is not finite.
"""

from __future__ import annotations

import os
import signal

from ringzero import comm
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import CHECK


class NonFiniteError(RuntimeError):
    """Too many non-finite steps in a row."""


class NonFinite:
    """A trainer's count of non-finite steps (see the module doc)."""

    def __init__(self, cfg, topology, queue) -> None:
        self.cfg, self.topo, self.queue = cfg, topology, queue
        self.fp16 = cfg.optim.precision == "fp16"
        self.in_a_row = 0
        self.steps: list[tuple[int, list[int]]] = []
        """(step, origin ranks) of every skipped step."""

    def before(self, step: int, strategy) -> None:
        """The faults injected at the start of `step`: an inf for the gradient, or this rank's death."""
        me = (self.topo.rank, step)
        if self.cfg.faults.inject_nonfinite == me:
            strategy.poison = True
        kill_if(self.cfg, *me)

    def after(self, step: int, skipped: bool, strategy) -> None:
        """After `step`'s update (before the gradients are zeroed); raises NonFiniteError."""
        if not skipped:
            self.in_a_row = 0
            return
        ranks = self._origin(strategy.nonfinite)
        self.steps.append((step, ranks))
        if self.fp16:
            return
        self.in_a_row += 1
        stop_if(self.in_a_row, self.cfg.faults.max_nonfinite, step, ranks)

    @tagged(CHECK)
    def _origin(self, mine: bool) -> list[int]:
        """The grid ranks whose own gradient was not finite (one all-reduce; only on skipped steps)."""
        import torch
        flags = torch.zeros(self.topo.world)
        flags[self.topo.rank] = float(mine)
        if self.topo.world > 1:
            self.queue.submit(comm.all_reduce, flags, op="sum", group=self.topo.grid_group, algorithm="torch")
            self.queue.drain()
        return [r for r in range(self.topo.world) if flags[r] > 0]


def kill_if(cfg, rank: int, step: int) -> None:
    """Die here (SIGKILL: no handler, no cleanup) if `cfg.faults.inject_kill` is (`rank`, `step`)."""
    if cfg.faults.inject_kill == (rank, step):
        os.kill(os.getpid(), signal.SIGKILL)


def stop_if(in_a_row: int, limit: int, step: int, ranks: list[int]) -> None:
    """Raise NonFiniteError once `in_a_row` skipped steps reach `limit`; `ranks`: whose own
    gradient held the inf or NaN at `step`."""
    if in_a_row < limit:
        return
    where = (f"an inf or NaN in rank {', '.join(map(str, ranks))}'s own gradient" if ranks else
             "in no rank's own gradient before its reduction (tensor-parallel or pipeline traffic)")
    raise NonFiniteError(f"gradients not finite in {in_a_row} step(s) in a row, the last step {step} "
                         f"({where}); stopping (max_nonfinite {limit})")


class Streak:
    """Skipped steps in a row, for a rank that has no `NonFinite` (a parameter server): call it
    after each update with (step, skipped, origin ranks)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_a_row = limit, 0

    def __call__(self, step: int, skipped: bool, ranks: list[int]) -> None:
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        stop_if(self.in_a_row, self.limit, step, ranks)
