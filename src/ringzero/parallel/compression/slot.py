"""A strategy's communication hook, if one is registered, and what its reductions measured.

`HookSlot` is what `FlatStrategy.register_comm_hook` fills: it checks the hook fits the strategy,
turns a `FlatGroup` into the hook's `GradBucket`, and times each reduction, so that the run reports
the hook's compute (the reduction's seconds less its collectives') beside the probe's prediction.
"""

from __future__ import annotations

import time

import torch

from ringzero.plan.strategies.compression import powersgd_split
from ringzero.parallel.compression.bucket import GradBucket, Link
from ringzero.parallel.compression.hook import CommHook


class HookSlot:
    def __init__(self) -> None:
        self.hook: CommHook | None = None
        self.link: Link | None = None
        self.compute_s = 0.0
        """Seconds the hook computed (not communicated) since `take_compute`."""

    def register(self, hook: CommHook, strategy) -> None:
        s = strategy.sharding
        if s.shard_params:
            raise ValueError(f"a communication hook runs on DP, ZeRO-1 or ZeRO-2, not {s.name} (ZeRO-3's "
                             "compressed reduction is ZeRO++'s qgZ)")
        if hook.stateful and s.reduces_every_micro_batch:
            raise ValueError(f"{hook.name} keeps a full-size residual and needs one reduction per step; "
                             f"{s.name} reduces every micro-batch: use zero1 or dp")
        self.hook = hook
        self.link = Link(strategy.group, strategy.topology.dp, strategy.config.algorithm_for)

    @property
    def active(self) -> bool:
        return self.hook is not None and self.hook.active and self.link.world > 1

    def reduce(self, g, shard: torch.Tensor | None = None) -> None:
        """Reduce group `g`'s gradient through the hook; under ZeRO-1/2 this rank's summed shard
        lands in `shard` (filled by the hook when it scatters, else cut from the whole sum)."""
        b = g.bucket
        bucket = GradBucket(g.index, g.grad_flat, b.offsets, b.shapes, shard if self.hook.scatters else None, g.finite,
                            g.shared)
        t0, c0 = time.perf_counter(), self.link.seconds
        self.hook.reduce(bucket, self.link)
        self.compute_s += (time.perf_counter() - t0) - (self.link.seconds - c0)
        if shard is not None and not self.hook.scatters:
            shard.copy_(g.grad_flat[b.lo:b.hi])

    def take_compute(self) -> float:
        out, self.compute_s = self.compute_s, 0.0
        return out

    def settle(self, skipped: bool, rescale: float = 1.0) -> None:
        if self.hook is not None:
            self.hook.settle(skipped, rescale)

    def set_step(self, step: int) -> None:
        if self.hook is not None:
            self.hook.set_step(step)

    def load_state_dict(self, state: dict[str, torch.Tensor], groups) -> bool:
        """Take `state` (a hook's `state_dict`) when it fits these buckets (each residual the size of
        its bucket, each Q the size the scheme gives it), else only its start step: a run resumed
        with other buckets or another rank starts with no residual. Returns whether it fitted."""
        if self.hook is None:
            return False
        c, want = self.hook.compression, {}
        for g in groups:
            want[f"residual.{g.index}"] = g.bucket.numel
            if c.scheme == "powersgd":
                want[f"q.{g.index}"] = powersgd_split([tuple(s) for s in g.bucket.shapes], c.rank)[1]
        tensors = {k: v for k, v in state.items() if k != "step"}
        fits = all(want.get(k) == v.numel() for k, v in tensors.items())
        self.hook.load_state_dict(state if fits else {k: v for k, v in state.items() if k == "step"})
        return fits

    def state_bytes(self) -> dict[str, int]:
        return self.hook.state_bytes() if self.hook is not None else {"residual": 0, "q": 0}
