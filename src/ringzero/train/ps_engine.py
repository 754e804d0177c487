"""A parameter-server run: workers compute gradients, servers own the parameters and the optimizer.

Ranks 0..W-1 are workers and W..W+S-1 servers (`ps_options`). Every rank builds the same model
from the same seed; a worker keeps it whole, as a data-parallel rank would, and a server keeps only
its key range of the flat parameter vector (the worker's buckets in order, cut by
`plan.strategies.param_server.server_ranges`), with the fp32 master and Adam's moments of that range. Each step
a worker runs its micro-batches, pushes the summed gradient range by range and pulls the new values
(`parallel.ps.client`); the servers apply them under the run's consistency model
(`parallel.ps.server`). The workers' batches are data parallelism's: worker i of W takes the i-th
share of the global batch, so a sync run sees the data an all-reduce run sees.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import timeline
from ringzero.comm.point_to_point import post
from ringzero.parallel.ps.client import PSClient
from ringzero.parallel.ps.server import CONTROL, PULLED, PUSHED, ParameterServer
from ringzero.parallel.topology import Topology
from ringzero.plan.strategies.param_server import server_ranges
from ringzero.run.config import TrainConfig
from ringzero.run.ps_options import ps_config
from ringzero.run.result import RankResult
from ringzero.train import ps_checkpoint
from ringzero.train.checkpointing import due
from ringzero.train.nonfinite import Streak, kill_if
from ringzero.train.replica import Replica, adam_config, micro_batches, train_data
from ringzero.train.step_schedule import GradAccumulation
from ringzero.train.steps import StepSpan, forward_backward, summarise, validate
from ringzero.train.straggler import straggle
from ringzero.train.tracing import Seat, Tracer


class PSWorker:
    """A worker: the whole model (a replica alone, `Topology.alone`), no optimizer; gradients out,
    parameters in."""

    def __init__(self, cfg: TrainConfig, index: int, workers: int, servers: list[int], group,
                 over_workers: "Members") -> None:
        self.cfg, self.index, self.count, self.over_workers = cfg, index, workers, over_workers
        self.group = group
        self.replica = Replica(cfg, Topology.alone())
        self.schedule = GradAccumulation()
        self.data = train_data(cfg)
        self.span = StepSpan(cfg.training.steps)
        self.client = PSClient(self.replica.strategy.owned_weights(), servers, group)
        if cfg.checkpoint.resume:
            self.span.set_start(ps_checkpoint.resume_worker(self.replica, index, workers, cfg.checkpoint.resume, group))
        self.ps_saver = ps_checkpoint.PSSaver(cfg, index, workers, len(servers), group) if cfg.checkpoint.save_dir else None

    def seat(self) -> Seat:
        """The workers are traced (their clocks anchored among themselves: the servers serve meanwhile)."""
        ranks = dist.get_process_group_ranks(self.group) if self.group is not None else list(range(dist.get_world_size()))
        name = getattr(self.group if self.group is not None else dist.group.WORLD, "group_name", "")
        return Seat(self.index, self.count, self.group, ({"name": "ps", "pg_name": str(name), "ranks": list(ranks)},),
                    list(range(self.count)))

    def _mean_over_workers(self, values: list[float]) -> list[float]:
        """The workers' mean of each of `values`, once, after the last step: averaging every step would
        make the workers wait for each other, which async and ssp must not."""
        t = torch.tensor(values, dtype=torch.float64)
        self.over_workers(t)
        return (t / self.count).tolist()

    @torch.no_grad()
    def evaluate(self) -> float:
        model, c = self.replica.model, self.cfg
        model.eval()
        # The whole validation batch on every worker (data parallelism's ranks share it out): a
        # worker's own view of the model is then measured on the same data as an all-reduce run's.
        losses = [model(x, y).item() for x, y in
                  (self.data.batch("val", i, c.training.micro_batch * self.count, 0, 1) for i in range(c.training.eval_batches))]
        model.train()
        return sum(losses) / len(losses)        # this worker's; averaged over the workers after the run

    def step(self, step: int, res: RankResult) -> tuple[dict[str, float], float]:
        c, st = self.cfg, self.replica.strategy
        t0 = time.perf_counter()
        batches = micro_batches(self.data, c, step, c.global_batch(self.count), self.index, self.count)
        # loss scale 1: a parameter server runs fp32 or bf16 only (`ps_options`), nothing to scale
        _, losses = forward_backward(self.replica, self.schedule, batches, 1.0, step == self.span.measured, res)
        compute = time.perf_counter() - t0
        slept = straggle(c, self.index, compute)
        grads = st.reduced_grads()
        if c.faults.inject_nonfinite == (self.index, step):
            grads[0].view(-1)[0] = float("inf")      # on purpose (`train.nonfinite`)
        with timeline.span("push/pull", "ps", step=step):
            blocked, held = self.client.push_pull(grads, step)
        st.zero_grad()
        return ({"compute": compute + slept, "straggler": slept, "wait": held, "comm": blocked - held},
                sum(losses) / len(losses))

    def run(self, progress=None, keep_params: bool = False) -> RankResult:
        c, span = self.cfg, self.span
        res = RankResult(rank=self.index, role="worker")
        phases, totals, start = [], [], time.perf_counter()
        own_val = res.val
        tracer = Tracer(c, self.seat(), span.start)
        for step in range(span.start, c.training.steps):
            kill_if(c, self.index, step)
            tracer.begin(step)
            t0 = time.time()
            ph, loss = span.timed(self.step, step, res, totals)
            t1 = time.time()
            if self.ps_saver is not None and due(c, step + 1):
                self.ps_saver.save_behind(step + 1)       # its RNG; the servers hold the state
            phases.append(ph)
            res.losses.append(loss)
            validate(c, step, res, self.evaluate, start)
            tracer.end(step, ph, t0, t1)
            if progress is not None:
                progress(step, res)
        res.trace = tracer.data
        self.client.stop()
        if self.ps_saver is not None:
            self.ps_saver.wait()
        res.ps.update(own_val=list(own_val))      # this worker's own view (async: not the others')
        means = self._mean_over_workers(res.losses + [v for _, v in res.val])
        n = len(res.losses)
        res.losses, res.val = means[:n], [(s, v) for (s, _), v in zip(res.val, means[n:])]
        summarise(res, totals, phases, self.replica.strategy)
        res.ps.update(waits=[p["wait"] for p in phases], computes=[p["compute"] for p in phases],
                      comms=[p["comm"] for p in phases])
        if keep_params:
            res.params = self.replica.full_params()
        self.replica.close()
        return res


class Members:
    """Sums over a subset of `group`'s ranks (the workers, or the servers) by point-to-point
    messages to the first of them and back: a worker's loss and validation loss, the servers'
    global gradient norm. No sub-group is made, so nothing waits on the other side's ranks."""

    TAG = 45

    def __init__(self, members: list[int], group) -> None:
        self.members, self.group = members, group

    def __call__(self, t: torch.Tensor) -> None:
        """Sum `t` in place over the members."""
        if len(self.members) == 1:
            return
        head, me = self.members[0], dist.get_rank(self.group)
        if me != head:
            total = torch.empty_like(t)
            sends, recvs = post(sends=[(head, t)], recvs=[(head, total)], group=self.group, tag=self.TAG,
                                key=CONTROL)
            for w in (*sends, *recvs):
                w.wait()
            t.copy_(total)
            return
        parts = [torch.empty_like(t) for _ in self.members[1:]]
        _, recvs = post(recvs=list(zip(self.members[1:], parts)), group=self.group, tag=self.TAG, key=CONTROL)
        for w in recvs:
            w.wait()
        for p in parts:                               # in member order: the same sum on every run
            t += p
        sends, _ = post(sends=[(m, t) for m in self.members[1:]], group=self.group, tag=self.TAG, key=CONTROL)
        for w in sends:
            w.wait()


def train_ps_rank(cfg: TrainConfig, group=None, progress=None, keep_params: bool = False) -> RankResult:
    """Run `cfg` (strategy ps) on this rank of `group`: a worker's steps or a server's loop."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    ps = ps_config(cfg, world)
    servers = list(range(ps.workers, world))
    side = Members(list(range(ps.workers)) if me < ps.workers else servers, group)
    if me < ps.workers:
        return PSWorker(cfg, me, ps.workers, servers, group, side).run(progress, keep_params)
    layout = Replica(cfg, Topology.alone())         # the workers' model, for its initial values
    flat = torch.cat([w.detach().reshape(-1) for w in layout.strategy.owned_weights()])
    lo, hi = server_ranges(flat.numel(), ps.servers)[me - ps.workers]
    server = ParameterServer(flat[lo:hi].clone(), ps, adam_config(cfg), range(ps.workers), group,
                             cfg.training.grad_accum, cfg.lr_at, side if ps.servers > 1 else None, Streak(cfg.faults.max_nonfinite))
    if cfg.checkpoint.resume:
        ps_checkpoint.resume_server(server, layout.strategy, lo, hi, cfg.checkpoint.resume)
    hooks = [lambda clock: kill_if(cfg, me, clock)]     # a server "begins" step k once its clock is k
    if cfg.checkpoint.save_dir:
        saver = ps_checkpoint.PSSaver(cfg, me, ps.workers, ps.servers, group)
        hooks.insert(0, saver.after_update(server, layout.strategy, lo, hi))
    server.after_update = lambda clock: [hook(clock) for hook in hooks]
    layout.close()
    meter = comm.TrafficMeter()
    t0 = time.perf_counter()
    with meter:
        log = server.serve()
    res = RankResult(rank=me, role="server")
    res.traffic = meter.summary()
    res.held = {"params": server.shard.numel() * server.shard.element_size(), "optimizer": server.opt.state_bytes()}
    res.ps = {"range": (lo, hi), "staleness": log.staleness, "updates": log.updates, "pushes": log.pushes,
              "wait_s": log.wait_s, "busy_s": log.busy_s, "seconds": time.perf_counter() - t0,
              "max_lead": log.max_lead, "update_s": log.update_s, "skipped": log.skipped,
              "keys": (PUSHED, PULLED, CONTROL)}
    return res
