"""The pipeline engine `parallel.wrap.wrap(..., pp_split=...)` returns: an `nn.Sequential` cut into
stages (`parallel.wrap_cut`, `parallel.pp.sequential`), each rank holding one stage, run by a
schedule over micro-batches, then reduced over the dp ranks of its stage and updated by the sharded
AdamW (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2021 §2.2).

A pipeline cannot backpropagate a loss computed outside it: the last stage computes the loss of
each micro-batch while the first is already running the next. So, as torch.distributed.pipelining's
`schedule.step(x, target=y)`, one call runs a whole step: `step(x, target=y)` splits the batch into
`microbatches` equal micro-batches along dim 0, plays this stage's forwards and backwards in the
schedule's order (`plan.pipeline.schedule.actions`, the planner's own list), reduces the gradients
after the flush and updates. The gradients are averaged over micro-batches and dp ranks, so a mean
`loss_fn` trains as the uncut model on the whole batch.

Why it cannot deadlock: a stage blocks only on a receive, right before the action that needs it,
and posts every send without waiting (waited for at the end of the step); the schedules' action
lists are those `plan.pipeline.schedule.simulate` plays, where one that could wait forever raises.
Activations and gradients travel under different tags.

Twins: the bytes of the whole step (pipeline messages, the dp strategy's collectives, the global
norm's all-reduce over the stages) and of the pipeline messages alone, from the schedule's message
counts (`plan.pipeline.schedule.messages`) times one message's bytes (`message_numel`); the
micro-batches whose activations a stage holds at its peak (`inflight`: GPipe all m, 1F1B p - i);
the weight, gradient and optimizer bytes of the stage, as the data-parallel engine's.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from ringzero import comm
from ringzero.comm import point_to_point, select, transport
from ringzero.comm.config import get_config
from ringzero.parallel.optimizer import AdamConfig
from ringzero.parallel.pp.pipeline import apply_pipeline
from ringzero.parallel.topology import Topology
from ringzero.parallel.wrap_cut import BoundaryShapes, check_stages_hold_weights, meta_children
from ringzero.parallel.wrap_engine import Engine, Pair
from ringzero.plan.comm.volume import call_for, formula, volume
from ringzero.plan.pipeline import schedule as schedules

ACTIVATIONS, GRADIENTS = 1, 2
"""Message tags of the two streams."""


def _message_bytes(t: torch.Tensor) -> int:
    """One message's bytes by the planner's formula: a (b, s, h) activation, s the dims between."""
    b, h = t.shape[0], t.shape[-1]
    return schedules.message_numel(b, math.prod(t.shape) // (b * h), h) * t.element_size()


class PipelineEngine(Engine):
    """This rank's stage of a pipeline, under a dp strategy over its stage's replicas (module doc)."""

    def __init__(self, model: nn.Sequential, cut_at: list[str], schedule: str, microbatches: int,
                 loss_fn: Callable, strategy: str, optimizer: AdamConfig, topology: Topology,
                 bucket_mb: float, algorithm: str) -> None:
        names, metas = meta_children(model)                  # before the cut drops the other stages
        self.stages = apply_pipeline(model, topology, cut_at=cut_at, loss_fn=loss_fn)   # checks the names
        bounds, i = [0, *(names.index(n) for n in cut_at), len(names)], topology.pp_rank
        check_stages_hold_weights(names, metas, bounds)
        self.shapes = BoundaryShapes(metas[:bounds[i + 1]], bounds[i])
        super().__init__(model, strategy, optimizer, topology, microbatches, bucket_mb, algorithm)
        # reduced once after the flush: a per-parameter hook would only cost (`accumulate_in_place`)
        self.strategy.accumulate_in_place()
        self.schedule, self.algorithm = schedule, algorithm
        p = topology.pp
        self.prev, self.next = (i - 1) % p, (i + 1) % p
        self.boundary: tuple[torch.Tensor, torch.Tensor] | None = None
        self.peak_inflight, self.p2p = 0, {"bytes_sent": 0, "bytes_recv": 0}

    def __call__(self, *args, **kwargs):
        raise RuntimeError("a pipeline runs forward and backward together: call step(x, target=y)")

    def backward(self, loss) -> None:
        raise RuntimeError("a pipeline computes its loss on the last stage: call step(x, target=y)")

    # -- one step ---------------------------------------------------------------------------------
    def step(self, x: torch.Tensor, target: torch.Tensor | None = None) -> dict:
        """Forward and backward of `x` in micro-batches, the dp reduction, the update. Every rank of
        the stage's pipeline passes its batch (the first stage runs it, the others read its shape;
        the last stage needs `target`). Returns {"losses" (per micro-batch, on the last stage; []
        elsewhere), "loss" (their mean, or None), "grad_norm", "skipped", "comm_s"}."""
        m, st = self.grad_accum, self.stages
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] % m:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"step(x, target=y): x must be a batch whose first dim divides into {m} "
                             f"micro-batches, got {got}")
        if st.is_last(0) and target is None:
            raise ValueError("step(x, target=y): the last stage needs the targets of its loss")
        xs, ys = x.chunk(m), (target.chunk(m) if target is not None else [None] * m)
        self.boundary = self.shapes(xs[0])
        with comm.TrafficMeter() as meter:
            losses = self._play(list(zip(xs, ys)))
            grads = self.strategy.reduced_grads()
            self.strategy.before_step()
            out = self.opt.step(grads, divisor=self.topology.dp * m)
            self.strategy.after_step()
        self.strategy.zero_grad()
        total, p2p = meter.total(), meter.records.get(point_to_point.KEY, comm.Traffic())
        self.traffic = {"bytes_sent": total.bytes_sent, "bytes_recv": total.bytes_recv}
        self.p2p = {"bytes_sent": p2p.bytes_sent, "bytes_recv": p2p.bytes_recv}
        return {"losses": losses, "loss": sum(losses) / len(losses) if losses else None, **out}

    def _play(self, micro: list) -> list[float]:
        """This stage's actions of the schedule; the gradients summed over micro-batches, then reduced."""
        topo, st = self.topology, self.stages
        acts = schedules.actions(topo.pp_rank, topo.pp, len(micro), self.schedule)
        self._sending, held, losses, self.peak_inflight = [], {}, [], 0
        self.strategy.sync = False
        for a in acts:
            if a.kind == "F":
                x, y = micro[a.micro]
                leaf = None if st.is_first(0) else self._recv(self.prev, self.boundary[0], ACTIVATIONS)
                if leaf is not None:       # the flat message is the leaf whose .grad goes back
                    x = st.gather_activation(leaf.requires_grad_(True), self.boundary[0].shape)
                out = st.forward(0, x, y)
                if st.is_last(0):
                    losses.append(out.item())
                else:
                    self._send(self.next, st.outgoing(out))
                held[a.micro] = (leaf, out)
                self.peak_inflight = max(self.peak_inflight, len(held))
            else:
                leaf, out = held.pop(a.micro)
                grad = None if st.is_last(0) else self._recv(self.next, self.boundary[1], GRADIENTS)
                torch.autograd.backward(out, None if grad is None else grad.view(out.shape))
                if leaf is not None:
                    self._send(self.prev, leaf.grad, GRADIENTS)
        for works, _ in self._sending:
            for w in works:
                w.wait()
        self._sending = []
        st.sync_tied_grads(self.strategy)
        self.strategy.reduce_now()
        return losses

    def _recv(self, peer: int, like: torch.Tensor, tag: int) -> torch.Tensor:
        buf = torch.empty(like.numel(), dtype=like.dtype)
        _, works = point_to_point.post(recvs=[(peer, buf)], group=self.topology.pp_group, tag=tag)
        for w in works:
            w.wait()
        return buf

    def _send(self, peer: int, t: torch.Tensor, tag: int = ACTIVATIONS) -> None:
        t = t.detach().contiguous()
        works, more = point_to_point.post(sends=[(peer, t)], group=self.topology.pp_group, tag=tag)
        self._sending.append((works + more, t))        # the tensor must live until the send completes

    # -- twins ------------------------------------------------------------------------------------
    def predicted_p2p(self) -> dict[str, int]:
        """The schedule's messages of this stage per step times one message's bytes (last step's shapes)."""
        if self.boundary is None:
            return {"bytes_sent": 0, "bytes_recv": 0}
        topo = self.topology
        n = schedules.messages(topo.pp_rank, topo.pp, self.grad_accum, self.schedule)
        inp, out = (_message_bytes(t) for t in self.boundary)
        return {"bytes_sent": n["activations_sent"] * out + n["gradients_sent"] * inp,
                "bytes_recv": n["activations_received"] * inp + n["gradients_received"] * out}

    def predicted_traffic(self) -> dict[str, int]:
        """The whole step: the dp strategy's collectives, the pipeline's messages, and the global
        norm's one-number fp32 all-reduce over the stages (`parallel.tp.grads.sum_over_owners`)."""
        dp, p2p, topo = super().predicted_traffic(), self.predicted_p2p(), self.topology
        algo = self.algorithm
        if algo == "auto":
            algo = select.choose("all_reduce", topo.pp, 4, get_config().node_size(topo.pp),
                                 transport.in_use(topo.pp_group))
        norm = volume(call_for("all_reduce", formula("all_reduce", algo), topo.pp, 1, 4), topo.pp_rank)
        return {"bytes_sent": dp["bytes_sent"] + p2p["bytes_sent"] + norm.bytes_sent,
                "bytes_recv": dp["bytes_recv"] + p2p["bytes_recv"] + norm.bytes_recv}

    def twins(self) -> list[Pair]:
        """The data-parallel engine's rows, the pipeline messages' bytes, the micro-batches held."""
        want, got, topo = self.predicted_p2p(), self.p2p, self.topology
        rows = [Pair(f"pipeline bytes {k.split('_')[1]} per step", want[k], got[k], "bytes") for k in want]
        held = schedules.inflight(topo.pp_rank, topo.pp, self.grad_accum, self.schedule)
        return super().twins() + rows + [Pair("micro-batches held at peak", held, self.peak_inflight,
                                              "micro-batches")]
