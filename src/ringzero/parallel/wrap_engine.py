"""The data-parallel engine `parallel.wrap.wrap` returns: a model under DP or ZeRO-1/2/3 (after an
optional tensor-parallel plan) with its sharded optimizer.

The engine runs the calls a strategy needs, in their order: gradients are reduced as backward
produces them (`FlatStrategy`), the last of `grad_accum` micro-batches triggers the reduction (DDP's
`no_sync` before it), the sharded AdamW updates this rank's shards, ZeRO-1/2 gather the weights
after it.

Twins (`twins()`): the bytes this rank sent and received in its last step (the traffic meter)
beside the planner's bytes for this model's buckets (`plan.comm.volume`, with "auto" resolved as
`comm.select` resolves it), and the weight, gradient and optimizer bytes it holds beside the ZeRO
formulas (`plan.strategies.memory.model_states`; measured bytes include the bucket padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ringzero import comm
from ringzero.comm import select, transport
from ringzero.comm.config import get_config
from ringzero.parallel.optimizer import AdamConfig, ShardedAdam
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.parallel.strategies import apply_sharding
from ringzero.parallel.topology import Topology
from ringzero.parallel.tp.grads import TensorParallelGrads
from ringzero.plan.comm.volume import call_for, formula, volume
from ringzero.plan.strategies import compression, sharding
from ringzero.plan.strategies.memory import model_states, state_bytes


@dataclass(frozen=True)
class Pair:
    """A number the planner predicts for this engine beside the engine's measurement of it."""

    name: str
    predicted: float
    measured: float
    unit: str

    @property
    def error(self) -> float | None:
        return (self.measured - self.predicted) / self.predicted if self.predicted else None


class Engine:
    """A model under a data-parallel strategy with its sharded optimizer (see the module doc)."""

    def __init__(self, model: nn.Module, strategy: str, optimizer: AdamConfig, topology: Topology,
                 grad_accum: int, bucket_mb: float, algorithm: str) -> None:
        self.module, self.topology, self.grad_accum = model, topology, grad_accum
        self.strategy = apply_sharding(model, topology, ShardingConfig(
            sharding=sharding.strategy(strategy), bucket_mb=bucket_mb, algorithm=algorithm))
        # the global norm (clipping) sums over the dp owners and the tp group, a replicated weight
        # counted on one tp rank (`parallel.tp.grads`), as the engine's trainer does
        self.tp_grads = TensorParallelGrads(self.strategy, topology, algorithm)
        self.opt = ShardedAdam(self.strategy.owned_weights(), optimizer, self.tp_grads.sum_over_owners(),
                               self.tp_grads.counted if topology.tp > 1 else None)
        self._micro, self._meter, self.traffic = 0, None, {"bytes_sent": 0, "bytes_recv": 0}
        self._reduced_with = None          # the last step's compression (`plan.strategies.compression`), if any

    def __call__(self, *args, **kwargs):
        """The model's forward (the first micro-batch of a step opens the step's traffic meter)."""
        if self._meter is None:
            self._meter = comm.TrafficMeter().__enter__()
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss; the step's last (`grad_accum`-th) reduces the gradients."""
        if self._micro == self.grad_accum:
            raise RuntimeError(f"backward() called {self._micro + 1} times without step(): with grad_accum="
                               f"{self.grad_accum} call step() after every {self.grad_accum} backward()")
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise TypeError("backward() takes the loss tensor of a forward through the engine")
        self.strategy.sync = self._micro == self.grad_accum - 1
        loss.backward()
        self.strategy.finish_backward()
        self._micro += 1

    def step(self) -> dict:
        """Update the weights from the step's reduced gradients (averaged over the dp ranks and the
        micro-batches), then zero them; returns {"grad_norm", "skipped", "comm_s"}."""
        if self._micro < self.grad_accum:
            raise RuntimeError(f"step() after {self._micro} of the {self.grad_accum} backward() calls of a step "
                               "(grad_accum): every micro-batch's loss goes through backward() first")
        grads = self.strategy.reduced_grads()
        self.tp_grads.sync(grads)
        self.strategy.before_step()
        out = self.opt.step(grads, divisor=self.topology.dp * self.grad_accum)
        self._reduced_with = self._compression()     # what this step reduced with, before settling moves on
        self.strategy.settle(out["skipped"])
        self.strategy.after_step()
        self.strategy.zero_grad()
        self._micro = 0
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            total = self._meter.total()
            self.traffic, self._meter = {"bytes_sent": total.bytes_sent, "bytes_recv": total.bytes_recv}, None
        return out

    def register_comm_hook(self, hook) -> None:
        """Reduce the gradients through `hook` (`parallel.compression`: Cast16, PowerSGD, TopK, or
        any `CommHook`), as DDP's `register_comm_hook`; its traffic and state become twins."""
        self.strategy.register_comm_hook(hook)

    def _compression(self):
        """The scheme the next reduction runs (None: the strategy's own)."""
        h = self.strategy.comm_hook
        return h.hook.compression if h.active else None

    def zero_grad(self) -> None:
        """Zero the gradient accumulators (`step` does it too) and forget a half-done step."""
        self.strategy.zero_grad()
        self._micro = 0

    def memory(self) -> dict[str, int]:
        """Bytes of weights, gradients and optimizer states this rank holds between steps."""
        return {**self.strategy.held_bytes(), "optimizer": self.opt.state_bytes()}

    def predicted_traffic(self) -> dict[str, int]:
        """The planner's bytes this rank sends and receives in one step over its buckets."""
        s, n, r = self.strategy.sharding, self.topology.dp, self.topology.dp_rank
        itemsize = self.opt.shards[0].element_size()
        sent = recv = 0
        for collective, count, size, times, _ in s.calls(self.strategy.layout(), n, itemsize, self.grad_accum,
                                                      self._reduced_with):
            algo = self.strategy.config.algorithm_for(collective)
            if algo == "auto":
                algo = select.choose(collective, n, count * size, get_config().node_size(n),
                                     transport.in_use(self.topology.group))
            v = volume(call_for(collective, formula(collective, algo), n, count, size), r)
            sent, recv = sent + times * v.bytes_sent, recv + times * v.bytes_recv
        return {"bytes_sent": sent, "bytes_recv": recv}

    def predicted_memory(self) -> dict[str, int]:
        """The ZeRO formulas' weight, gradient and optimizer bytes of this rank (Rajbhandari et al.
        2020, Figure 1) for the model's parameters on this rank."""
        local = sum(n for n, *_ in self.strategy.layout())
        mixed = "fp32" if self.opt.shards[0].dtype == torch.float32 else "bf16"
        p, g, o, _ = model_states(local, state_bytes(mixed, "adam"), dp=self.topology.dp,
                                  zero=self.strategy.sharding.zero)
        return {"params": p, "grads": g, "optimizer": o}

    def twins(self) -> list[Pair]:
        """The planner beside the measurement: bytes on the wire in the last step, bytes held."""
        want, got = self.predicted_traffic(), self.traffic
        rows = [Pair(f"bytes {k.split('_')[1]} per step", want[k], got[k], "bytes") for k in want]
        held, formula_ = self.memory(), self.predicted_memory()
        rows += [Pair(f"{k} held", formula_[k], held[k], "bytes") for k in held]
        c = self._reduced_with
        if c is not None and c.stateful:
            g = self.strategy.groups[0].bucket
            kept = compression.state_bytes(c, [b[2] for b in self.strategy.layout()], g.params[0].element_size(),
                                           g.dtype == torch.float16)
            rows += [Pair(f"{c.scheme} {k} held", kept[k], v, "bytes")
                     for k, v in self.strategy.comm_hook.state_bytes().items() if kept[k]]
        return rows

    def state_dict(self) -> dict:
        """This rank's state: the full weights by name, its optimizer shard's (t, master, m, v), and
        its communication hook's (residuals, Q: they differ on every rank)."""
        o = self.opt
        hook = self.strategy.comm_hook.hook
        return {"model": self.strategy.full_params(), "optimizer": {
            "t": o.t, "master": [t.clone() for t in o.master], "exp_avg": [t.clone() for t in o.exp_avg],
            "exp_avg_sq": [t.clone() for t in o.exp_avg_sq]},
            "comm_hook": {k: v.clone() for k, v in hook.state_dict().items()} if hook is not None else {}}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned on this rank (a collective: every rank calls it)."""
        o, saved = self.opt, state["optimizer"]
        if len(saved["master"]) != len(o.master) or any(a.shape != b.shape for a, b in zip(saved["master"], o.master)):
            raise ValueError("load_state_dict: the optimizer shards differ from this engine's (another model, "
                             "strategy or number of ranks)")
        with torch.no_grad():
            for mine, theirs in zip(o.master + o.exp_avg + o.exp_avg_sq,
                                    saved["master"] + saved["exp_avg"] + saved["exp_avg_sq"]):
                mine.copy_(theirs)
            for shard, master in zip(o.shards, o.master):
                shard.copy_(master)
        o.t = int(saved["t"])
        self.strategy.comm_hook.load_state_dict(state.get("comm_hook", {}), self.strategy.groups)
        self.strategy.after_step()                   # ZeRO-1/2: the full weights from the shards

    def close(self) -> None:
        self.strategy.close()
