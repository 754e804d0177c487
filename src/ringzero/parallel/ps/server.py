"""A parameter server rank: it owns one key range of the flat parameter vector, applies the workers'
gradient pushes to it and answers with the range's new values (Li et al. 2014, OSDI §3-4).

Messages, over `comm.point_to_point` (metered under "ps/control", "ps/push" and "ps/pull"):

    worker -> server   header [PUSH, step, clock read, Σ g²]  then the gradient of the range
                       header [STOP, ...]                       after its last pull
    server -> worker   header [clock, held]                     then the range's parameters

The server takes headers from whichever worker sends first (an any-source receive: it sleeps until
one arrives), so it serves workers in arrival order and never waits on one that is slow.

Consistency (`plan.strategies.param_server.PSConfig`):

- sync (BSP): the step's pushes are kept until every worker's has arrived, summed in worker order
  and applied as one update (divided by workers x micro-batches, clipped by the global norm summed
  over the servers: the arithmetic of all-reduce data parallelism); then every worker is answered.
- async: each push is applied on arrival (divided by the worker's micro-batches, clipped by that
  worker's own gradient norm) and answered at once.
- ssp (Ho et al. 2013): applied on arrival as async, but the answer to a worker about to start step
  c waits until the slowest worker's clock is >= c − S (`plan.strategies.param_server.max_staleness`).

`held` is how long the server kept this worker's push before it could answer: sync, from its
arrival to the step's last push's; ssp, from its update to the gate's opening; async, 0. That is
the worker's wait for its peers, timed apart from moving its bytes and from the server's update.

Each applied push records its staleness: the worker's step minus the clock (the slowest worker's)
carried by the parameters it computed on, the gap SSP bounds by S (sync: 0).
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ringzero.comm.point_to_point import post, recv_any
from ringzero.plan.strategies.param_server import PSConfig
from ringzero.watchdog import beacon
from ringzero.parallel.optimizer import AdamConfig, ShardedAdam
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import PS

PUSH, STOP = 1.0, 2.0
HEADER = 4
"""float64 fields of a worker's header: kind, step, clock read, squared gradient norm."""
TAG_HEADER, TAG_GRAD, TAG_REPLY, TAG_PARAMS = 41, 42, 43, 44
CONTROL, PUSHED, PULLED = "ps/control", "ps/push", "ps/pull"
"""Meter keys: headers, gradients pushed, parameters pulled."""


class ServerState(enum.Enum):
    SERVING = "serving"
    """Workers are still pushing."""
    CLOSED = "closed"
    """Every worker said STOP and every answer has been sent."""


@dataclass
class ServerLog:
    """What a server saw (plain data: it crosses process boundaries)."""

    staleness: list[int] = field(default_factory=list)
    """Per applied update (sync: per step, always 0), in the order applied."""
    updates: int = 0
    pushes: int = 0
    wait_s: float = 0.0
    """Seconds blocked waiting for a worker's header."""
    busy_s: float = 0.0
    """Seconds receiving gradients, updating and answering."""
    update_s: list[float] = field(default_factory=list)
    """Seconds of each update (the optimizer step on this server's range), in the order applied."""
    steps_by_worker: dict[int, int] = field(default_factory=dict)
    max_lead: int = 0
    """The most steps a worker was let start ahead of the server's clock (ssp: at most S)."""
    skipped: list[tuple[int, list[int]]] = field(default_factory=list)
    """(step, workers whose pushed gradient was not finite) of every update skipped for a non-finite norm."""


class ParameterServer:
    """Serve `workers` (group ranks of `group`) on `shard`, this server's range of the flat vector
    (initial values; updated in place). `sum_over_servers(t)` sums a tensor over the server ranks
    (sync's global norm; None with one server). `lr_at(step)` is the schedule."""

    def __init__(self, shard: torch.Tensor, ps: PSConfig, adam: AdamConfig, workers: Sequence[int], group,
                 grad_accum: int, lr_at: Callable[[int], float],
                 sum_over_servers: Callable[[torch.Tensor], None] | None = None,
                 streak: Callable[[int, bool, list[int]], None] | None = None) -> None:
        self.ps, self.workers, self.group = ps, list(workers), group
        self.grad_accum, self.lr_at = grad_accum, lr_at
        self._sum_over_servers, self._push_sq = sum_over_servers, 0.0
        self.shard = shard
        self.opt = ShardedAdam([shard], adam, self._norm)
        self.clock = {w: 0 for w in self.workers}
        self.stash: dict[int, torch.Tensor] = {}
        self.grad = {w: torch.empty_like(shard) for w in self.workers}
        self.pending: list[tuple[int, int]] = []        # (worker, step it starts next), ssp
        self.sends: dict[int, list] = {w: [] for w in self.workers}
        self.reply: dict[int, torch.Tensor] = {w: torch.empty_like(shard) for w in self.workers}
        self.reply_clock = {w: torch.empty(2, dtype=torch.float64) for w in self.workers}
        self.ready_at = {w: 0.0 for w in self.workers}
        """When each worker's latest push was ready to be answered but for its peers (perf_counter)."""
        self.held = {w: 0.0 for w in self.workers}
        self.state, self.active = ServerState.SERVING, set(self.workers)
        self.log = ServerLog()
        self.sq = {w: 0.0 for w in self.workers}
        """Each worker's Σ g² of its latest push, as its header said (non-finite: the inf's origin)."""
        self.streak = streak
        """Told (step, skipped, workers whose push was not finite) after each update: it may stop the run."""
        self.after_update: Callable[[int], None] | None = None
        """Called with the clock after each update is answered (a checkpoint's hook)."""

    def _norm(self, sq: torch.Tensor) -> None:
        """sync: the global Σ g² over the servers; async/ssp: the pushing worker's own (fp32: of its
        gradient averaged over its micro-batches, as the optimizer divides before the norm)."""
        if self.ps.mode == "sync":
            if self._sum_over_servers is not None:
                self._sum_over_servers(sq)
            return
        scale = 1.0 if self.shard.dtype != torch.float32 else self.grad_accum ** 2
        sq.fill_(self._push_sq / scale)

    def server_clock(self) -> int:
        return min(self.clock.values())

    @tagged(PS)
    def serve(self) -> ServerLog:
        """Answer pushes until every worker has stopped; returns the log."""
        header = torch.empty(HEADER, dtype=torch.float64)
        while self.active:
            t0 = time.perf_counter()
            src = recv_any(header, self.group, TAG_HEADER, CONTROL)
            t1 = time.perf_counter()
            self.log.wait_s += t1 - t0
            kind, step, read, sq = header.tolist()
            if kind == STOP:
                self.active.discard(src)
            else:
                self._push(src, int(step), int(read), sq)
            self.log.busy_s += time.perf_counter() - t1
        for w in self.workers:
            self._settle(w)
        self.state = ServerState.CLOSED
        beacon().finished()
        return self.log

    def _push(self, src: int, step: int, read: int, sq: float) -> None:
        _, (got,) = post(recvs=[(src, self.grad[src])], group=self.group, tag=TAG_GRAD, key=PUSHED)
        got.wait()
        self.ready_at[src] = time.perf_counter()
        self.sq[src] = sq
        self.log.pushes += 1
        self.log.steps_by_worker[src] = step + 1
        if self.ps.mode == "sync":
            self.stash[src] = self.grad[src]
            if len(self.stash) < len(self.workers):
                return
            last = time.perf_counter()                  # every push is in: nobody waits any longer
            for w in self.workers:
                self.held[w] = last - self.ready_at[w]
            total = self.stash[self.workers[0]].clone()
            for w in self.workers[1:]:                  # worker order: the same sum on every run
                total += self.stash[w]
            self.stash.clear()
            self._update(total, len(self.workers) * self.grad_accum, step, self.workers)
            self._record(0)
            for w in self.workers:
                self.clock[w] += 1
                self._answer(w)
            beacon().step_done(self.server_clock())   # the job's watchdog sees the server progress
            if self.after_update is not None:
                self.after_update(self.server_clock())
            return
        self._record(step - read)
        self._push_sq = sq
        self._update(self.grad[src], self.grad_accum, step, [src])
        self.clock[src] += 1
        beacon().step_done(self.server_clock())
        self.ready_at[src] = time.perf_counter()
        self.pending.append((src, step + 1))
        self._release()
        if self.after_update is not None:
            self.after_update(self.server_clock())

    def _update(self, grad: torch.Tensor, divisor: int, step: int, pushers: list[int]) -> None:
        """Apply `grad` (the push of `pushers`); a non-finite norm skips it (`ShardedAdam.step`)
        and the skip is logged with the workers it came from."""
        t0 = time.perf_counter()
        skipped = self.opt.step([grad], divisor=divisor, lr=self.lr_at(step))["skipped"]
        self.log.update_s.append(time.perf_counter() - t0)
        origin = [w for w in pushers if not math.isfinite(self.sq[w])] if skipped else []
        if skipped:
            self.log.skipped.append((step, origin))
        if self.streak is not None:
            self.streak(step, skipped, origin)

    def _record(self, staleness: int) -> None:
        self.log.updates += 1
        self.log.staleness.append(staleness)


    def _release(self) -> None:
        """Answer every waiting worker the gate lets start its next step (async: all of them)."""
        bound = self.ps.bound()
        now = self.server_clock()
        ready = [(w, c) for w, c in self.pending if bound is None or now >= c - bound]
        self.pending = [p for p in self.pending if p not in ready]
        for w, c in ready:
            self.held[w] = time.perf_counter() - self.ready_at[w]
            self.log.max_lead = max(self.log.max_lead, c - now)
            self._answer(w)

    def _answer(self, w: int) -> None:
        """Send worker `w` the server's clock and a copy of the range (the shard changes under later
        updates while the send may still be in flight)."""
        self._settle(w)
        self.reply[w].copy_(self.shard)
        self.reply_clock[w].copy_(torch.tensor([float(self.server_clock()), self.held[w]]))
        head, _ = post(sends=[(w, self.reply_clock[w])], group=self.group, tag=TAG_REPLY, key=CONTROL)
        body, _ = post(sends=[(w, self.reply[w])], group=self.group, tag=TAG_PARAMS, key=PULLED)
        self.sends[w] = [*head, *body]

    def _settle(self, w: int) -> None:
        """Wait for the sends to `w` still in flight (before its reply buffers are reused)."""
        for work in self.sends[w]:
            work.wait()
        self.sends[w] = []

