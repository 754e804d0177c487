"""Pipeline schedules run: each stage plays its actions from `plan.pipeline.schedule` (GPipe, 1F1B,
interleaved 1F1B) on its model chunks, passing activations forward and gradients back by metered
point-to-point (`ringzero.comm.point_to_point`).

Why this cannot deadlock: a stage blocks only on a receive, right before the action that needs it;
every send is posted without waiting (and waited for at the end of the step). On gloo a receive is
posted `RECEIVE_AHEAD` actions early, so its bytes move while the stage computes (gloo's rendezvous
costs three socket round trips per message, on the critical path if posted late); waiting still
happens where it did. On NCCL separately issued point-to-point calls run in order on one stream, so
a receive posted early would hold back this stage's sends behind it: there it is posted when
needed. So a stage waits only
for a message whose sender has reached it in its own action list, and the schedules' action lists
are exactly those `plan.pipeline.schedule.simulate` plays with instantaneous messages, where a schedule that
could wait forever raises. Activations and gradients travel under different tags, so the two streams
between one pair of stages (both exist under interleaving, and with two stages) never cross.

What each stage records, per step: when each forward and backward began and ended (one clock for the
ranks of a machine: `time.perf_counter`, CLOCK_MONOTONIC), the time it waited for messages, and
when measuring, the bytes autograd saved in each forward, to find the peak held at once (the
activation twin: GPipe holds all m micro-batches, 1F1B at most p - i on stage i).

Synthetic costs (`cost=(forward_s, backward_s)`): each stage's forward and backward of a micro-batch
last at least that long (v chunks share it), padded with a sleep, so on a machine whose cores the
ranks share the schedule, not the load, sets the timing and the measured idle fraction can be held
against (p-1)/(m+p-1).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ringzero.comm import point_to_point
from ringzero.parallel.flat_strategy import FlatStrategy
from ringzero.parallel.pp.boundary import StageBoundary
from ringzero.parallel.recompute import SavedBytes
from ringzero.parallel.topology import Topology
from ringzero.plan.pipeline import schedule as schedules
from ringzero.train.step_schedule import StepHooks

ACTIVATIONS, GRADIENTS = 1, 2
"""Message tags of the two streams."""
RECEIVE_AHEAD = 4
"""Actions ahead whose receives a gloo stage posts early. Step time against torch.distributed.pipelining
on 2 ranks (GPT 8 x 256, m = 8, paired medians of 22 steps, GPipe / 1F1B / interleaved): posted
when needed 0.95 / 0.99 / 1.03, 1 ahead 0.95 / 0.99 / 0.99, 2 ahead 0.91 / 0.96 / 0.97, 4 ahead
0.91 / 0.93 / 0.92: `ringzero bench train --nproc 2 --suites '' --pp 2 --pp-layers 8
--pp-microbatches 8 --steps 22` with this constant at 0, 1, 2 and 4."""


class PipelineSchedule:
    """Stage `topology.pp_rank`'s part of `schedule` over `stages` (a
    `parallel.pp.pipeline.PipelineStages`, or `parallel.pp.sequential.SequentialStages`); a
    `train.protocols.StepSchedule`."""

    def __init__(self, stages: StageBoundary, topology: Topology, schedule: str, virtual_stages: int,
                 activation_shape: tuple[int, ...], dtype: torch.dtype, cost: tuple[float, float] | None = None) -> None:
        self.stages, self.topology, self.schedule, self.v = stages, topology, schedule, virtual_stages
        self.shape, self.dtype, self.cost = activation_shape, dtype, cost
        self.numel = stages.incoming_numel(int(torch.Size(activation_shape).numel()))
        self.ahead = 0 if dist.get_backend(topology.pp_group) == "nccl" else RECEIVE_AHEAD
        p, i = topology.pp, topology.pp_rank
        self.prev, self.next = (i - 1) % p, (i + 1) % p
        self.events: list[tuple[str, int, int, float, float]] = []
        """The last step's (kind, micro, local chunk, start, end)."""
        self.peak_inflight = 0
        """The most chunk micro-batches whose activations this stage held at once in the last step."""

    # -- messages ---------------------------------------------------------------------------------
    def _receives(self, acts: list[schedules.Action]) -> list[tuple[int, int] | None]:
        """(peer, tag) each action receives from, or None."""
        st = self.stages
        return [(self.prev, ACTIVATIONS) if a.kind == "F" and not st.is_first(a.chunk) else
                (self.next, GRADIENTS) if a.kind == "B" and not st.is_last(a.chunk) else None for a in acts]

    def _post_until(self, needs: list[tuple[int, int] | None], stop: int) -> None:
        """Post the receives of actions before `stop` not posted yet, in action order (the order the
        peers send in, per tag)."""
        while self._posted_until < min(stop, len(needs)):
            need = needs[self._posted_until]
            if need is not None:
                buf = torch.empty(self.numel, dtype=self.dtype)
                _, works = point_to_point.post(recvs=[(need[0], buf)], group=self.topology.pp_group, tag=need[1])
                self._pending[self._posted_until] = (buf, works)
            self._posted_until += 1

    def _recv(self, needs: list[tuple[int, int] | None], j: int, hooks: StepHooks) -> torch.Tensor:
        """Action j's message, once it has arrived (posting the receives `ahead` actions on)."""
        self._post_until(needs, j + 1 + self.ahead)
        buf, works = self._pending.pop(j)
        with hooks.phase("pipeline_wait"):
            for w in works:
                w.wait()
        return buf

    def _send(self, peer: int, t: torch.Tensor, tag: int) -> None:
        works, more = point_to_point.post(sends=[(peer, t)], group=self.topology.pp_group, tag=tag)
        self._sending.append((works + more, t))        # the tensor must live until the send completes

    def _pad(self, start: float, kind: str) -> None:
        if self.cost is None:
            return
        rest = start + self.cost[0 if kind == "F" else 1] / self.v - time.perf_counter()
        if rest > 0:
            time.sleep(rest)

    # -- one step ---------------------------------------------------------------------------------
    def run(self, model: nn.Module, strategy: FlatStrategy, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
            loss_scale: float, hooks: StepHooks) -> list[float]:
        """Losses of the micro-batches (on the last stage; empty elsewhere); gradients reduced over
        the tied-embedding pair and the dp group, left in `strategy`."""
        topo = self.topology
        acts = schedules.actions(topo.pp_rank, topo.pp, len(micro_batches), self.schedule, self.v)
        needs = self._receives(acts)
        strategy.sync = False
        self._pending, self._posted_until, self._sending, self.events = {}, 0, [], []
        self._held, self._saved, self._losses = {}, {}, []
        self.peak_inflight = peak_bytes = 0
        for j, a in enumerate(acts):
            if a.kind == "F":
                t0 = self._forward(model, j, a, needs, micro_batches[a.micro], loss_scale, hooks)
                self.peak_inflight = max(self.peak_inflight, len(self._held))
                peak_bytes = max(peak_bytes, sum(self._saved.values()))
            else:
                t0 = self._backward(j, a, needs, hooks)
            self.events.append((a.kind, a.micro, a.chunk, t0, time.perf_counter()))
        with hooks.phase("pipeline_wait"):
            self._wait_sends()
        if hooks.measure:
            hooks.saved_bytes = peak_bytes
        with hooks.phase("comm"):
            self.stages.sync_tied_grads(strategy)
            strategy.reduce_now()
        return self._losses

    def _forward(self, model: nn.Module, j: int, a: schedules.Action, needs: list[tuple[int, int] | None],
                 batch: tuple[torch.Tensor, torch.Tensor], loss_scale: float, hooks: StepHooks) -> float:
        """Action j, a forward: receive its input (unless the model's first chunk), run the chunk
        (counting what autograd saves when measuring), send the output on. Returns its start."""
        st, (x, y), leaf = self.stages, batch, None
        if not st.is_first(a.chunk):
            leaf = self._recv(needs, j, hooks).requires_grad_(True)
        t0 = time.perf_counter()
        with hooks.phase("forward", micro=a.micro, chunk=a.chunk):
            if leaf is not None:
                x = st.gather_activation(leaf, self.shape)
            if hooks.measure:
                with SavedBytes(model) as meter:
                    out = st.forward(a.chunk, x, y)
                self._saved[(a.micro, a.chunk)] = meter.total
            else:
                out = st.forward(a.chunk, x, y)
            if st.is_last(a.chunk):
                self._losses.append(out.item())
                out = out * loss_scale
        self._pad(t0, "F")             # before the send: the next stage starts when this one's cost has passed
        if not st.is_last(a.chunk):
            self._send(self.next, st.outgoing(out), ACTIVATIONS)
        self._held[(a.micro, a.chunk)] = (leaf, out)
        return t0

    def _backward(self, j: int, a: schedules.Action, needs: list[tuple[int, int] | None], hooks: StepHooks) -> float:
        """Action j, a backward: receive the output's gradient (unless the model's last chunk),
        backpropagate, send the input's gradient back. Returns its start."""
        st = self.stages
        leaf, out = self._held.pop((a.micro, a.chunk))
        grad = None if st.is_last(a.chunk) else self._recv(needs, j, hooks)
        t0 = time.perf_counter()
        with hooks.phase("backward", micro=a.micro, chunk=a.chunk):
            torch.autograd.backward(out, None if grad is None else st.gather_grad(grad, self.shape))
        self._pad(t0, "B")
        if leaf is not None:
            self._send(self.prev, leaf.grad, GRADIENTS)
        self._saved.pop((a.micro, a.chunk), None)
        return t0

    def _wait_sends(self) -> None:
        for works, _ in self._sending:
            for w in works:
                w.wait()
        self._sending = []

    @torch.no_grad()
    def forward_only(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
        """Losses of `micro_batches` (x, y) through the pipeline, no backward (evaluation); on the
        last stage, empty elsewhere."""
        st, hooks = self.stages, StepHooks(None)
        # Micro-batch by micro-batch, chunk by chunk: every stage waits only on earlier pairs.
        acts = [schedules.Action("F", k, c) for k in range(len(micro_batches)) for c in range(self.v)]
        needs = self._receives(acts)
        self._sending, self._pending, self._posted_until, losses = [], {}, 0, []
        for j, a in enumerate(acts):
            x, y = micro_batches[a.micro]
            if not st.is_first(a.chunk):
                x = st.gather_activation(self._recv(needs, j, hooks), self.shape)
            out = st.forward(a.chunk, x, y)
            if st.is_last(a.chunk):
                losses.append(out.item())
            else:
                self._send(self.next, st.outgoing(out), ACTIVATIONS)
        self._wait_sends()
        return losses
