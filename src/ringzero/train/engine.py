"""The training loop of a dp x tp x pp grid's rank: build, train, evaluate, measure.

The rank holds its replica of the model (`replica`: built, split, cut to its stage and sharded in
torchtitan's order) and, over the weights it owns, its optimizer. Each step runs its micro-batches
through a step schedule (`step_schedule`; a pipeline's in `pipeline_schedule`), then the optimizer;
DP and ZeRO-1 communicate only on the last micro-batch (under a pipeline, after its flush).
The run measures what the planner predicts: model-state bytes held, bytes saved for backward,
bytes sent and received (traffic meter), and time per phase (`steps`). With `calibrate`, every rank
also probes this machine's rates at `probe.probe_steps` (before the first step, between steps, after
the last; never inside a timed step), so the prediction sees the load the steps saw.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import timeline
from ringzero.parallel.offload.optimizer import offloaded_adam
from ringzero.parallel.precision import LossScaler, NoScaler, dtype
from ringzero.parallel.tp.grads import TensorParallelGrads
from ringzero.parallel.topology import Topology
from ringzero.run import compress_options
from ringzero.run.config import TrainConfig
from ringzero.run.result import RankResult
from ringzero.train import checkpointing, offload_probe, offloading
from ringzero.train.nonfinite import NonFinite
from ringzero.train.pipeline_schedule import PipelineSchedule
from ringzero.train.probe import Prober, probe_steps
from ringzero.train.replica import Replica, adam_config, micro_batches, train_data
from ringzero.train.step_schedule import GradAccumulation
from ringzero.train.steps import StepSpan, forward_backward, summarise, validate
from ringzero.train.straggler import straggle
from ringzero.train import memory_use
from ringzero.train.tracing import Seat, Tracer
from ringzero.twin.rates import median_rates
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import LOSS


class Trainer:
    """One rank of the grid: its replica, the optimizer and loss scaler, the step schedule, the data,
    its share of checkpoints and its count of non-finite steps."""

    def __init__(self, cfg: TrainConfig, topology: Topology) -> None:
        self.cfg, self.topo = cfg, topology
        self.replica = r = Replica(cfg, topology)
        self.tp_grads = TensorParallelGrads(r.strategy, topology, cfg.parallel.tp_algorithm)
        self.opt = offloaded_adam(r.strategy.owned_weights(), adam_config(cfg),
                                  offloading.optimizer_offload(cfg), self.tp_grads.sum_over_owners(),
                                  self.tp_grads.counted if topology.tp * topology.pp > 1 else None,
                                  rank=dist.get_rank() if dist.is_initialized() else 0)
        self.scaler = LossScaler.from_config(cfg.optim.loss_scaler) if cfg.optim.precision == "fp16" else NoScaler()
        self.schedule = GradAccumulation() if r.stages is None else PipelineSchedule(
            r.stages, topology, cfg.parallel.schedule, cfg.parallel.virtual_stages, self._boundary_shape(),
            dtype(cfg.optim.precision), cfg.parallel.pipeline_cost)
        if r.stages is not None:      # reduced after the pipeline's flush, never during backward
            r.strategy.accumulate_in_place()
        self._last_compute = 0.0
        self.data = train_data(cfg)
        self.span = StepSpan(cfg.training.steps, compress_options.start(cfg) if cfg.compress.compress != "none" else 0)
        if cfg.checkpoint.resume is not None:
            self.span.set_start(checkpointing.load_checkpoint(self, cfg.checkpoint.resume))
        r.strategy.comm_hook.set_step(self.span.start)
        if cfg.checkpoint.init_from is not None:
            checkpointing.init_weights(self, cfg.checkpoint.init_from)
        self.saver = checkpointing.Saver(self) if cfg.checkpoint.save_dir is not None else None
        self.nonfinite = NonFinite(cfg, topology, r.queue)

    # The replica's parts under the names checkpointing, the benchmarks and the tests read.
    model = property(lambda self: self.replica.model)
    tp = property(lambda self: self.replica.tp)
    strategy = property(lambda self: self.replica.strategy)
    start = property(lambda self: self.span.start)

    def _boundary_shape(self) -> tuple[int, int, int]:
        """What crosses a stage boundary per micro-batch: (b, s, h), (b, s/t, h) with sequence parallelism."""
        c = self.cfg
        return (c.training.micro_batch, c.shape.seq // (c.parallel.tp if c.parallel.sequence_parallel else 1), c.shape.hidden)

    def step(self, step: int, res: RankResult) -> tuple[dict[str, float], float]:
        """One optimizer step; returns (seconds per phase, this rank's mean loss)."""
        c, t, st = self.cfg, self.topo, self.strategy
        measured = step == self.span.measured
        # An injected straggler sleeps before its forward (for its previous step's compute), so that
        # its peers wait for it inside this step's collectives, where a slow GPU would hold them.
        slept = straggle(c, t.rank, self._last_compute)
        self.nonfinite.before(step, st)
        batches = micro_batches(self.data, c, step, c.global_batch(t.world), t.dp_rank, t.dp)
        hooks, losses = forward_backward(self.replica, self.schedule, batches, self.scaler.scale, measured, res)
        # forward and backward only: a slow device computes longer, its collectives take as long
        self._last_compute = hooks.seconds["forward"] + hooks.seconds["backward"]
        if measured:
            res.held = {**st.held_bytes(), "optimizer": self.opt.state_bytes()}
            res.offload = {"optimizer": self.opt.placement_bytes(), "params": st.offload_bytes()}
            res.gathered = {s.value: n for s, n in getattr(st, "peak_gathered", {}).items()}
        grads = st.reduced_grads()
        with hooks.phase("comm"):
            self.tp_grads.sync(grads)
        with hooks.phase("optimizer"):
            st.before_step()
            out = self.opt.step(grads, divisor=t.dp * c.training.grad_accum,
                                loss_scale=self.scaler.scale, lr=c.lr_at(step))
        if measured:
            res.offload["disk_io"] = {"optimizer": self.opt.io_bytes(), "params": st.offload_io_bytes()}
        with hooks.phase("comm"):
            st.after_step()
        before, hooked = float(self.scaler.scale), st.comm_hook.active
        self.scaler.update(out["skipped"])
        if out["skipped"]:
            timeline.instant("skipped step", step=step + 1, loss_scale=float(self.scaler.scale))
        st.settle(out["skipped"], float(self.scaler.scale) / before)   # a residual follows the loss scale
        spent = st.comm_hook.take_compute()
        res.compress_s.append(spent if hooked else None)
        if measured:
            res.compress = st.comm_hook.state_bytes()          # kept once the step settled
        self.nonfinite.after(step, out["skipped"], st)
        st.zero_grad()
        ph = hooks.seconds
        ph["straggler"] = slept                  # compute, made longer on purpose (`straggle`)
        ph["optimizer"] -= out["comm_s"]         # the norm's all-reduce is communication
        ph["comm"] += out["comm_s"]
        return ph, sum(losses) / len(losses) if losses else 0.0

    @tagged(LOSS)
    def _mean_over_ranks(self, value: float) -> float:
        """The mean over the dp ranks of `value` (a pipeline's: the last stage's)."""
        t, queue = torch.tensor([value], dtype=torch.float64), self.replica.queue
        if self.topo.dp > 1:
            queue.submit(comm.all_reduce, t, op="avg", group=self.topo.group, algorithm="torch")
        if self.topo.pp > 1:             # only the last stage has it; the others add 0
            if self.topo.pp_rank != self.topo.pp - 1:
                t.zero_()
            queue.submit(comm.all_reduce, t, op="sum", group=self.topo.pp_group, algorithm="torch")
        queue.drain()
        return float(t)

    @torch.no_grad()
    @timeline.spanned("validate", "eval")
    def evaluate(self) -> float:
        self.model.eval()
        c, t = self.cfg, self.topo
        batches = [self.data.batch("val", i, c.training.micro_batch * t.dp, t.dp_rank, t.dp) for i in range(c.training.eval_batches)]
        if self.replica.stages is None:
            losses = [self.model(x, y).item() for x, y in batches]
        else:
            losses = self.schedule.forward_only(batches)
        self.strategy.finish_backward()
        self.model.train()
        return self._mean_over_ranks(sum(losses) / len(losses) if losses else 0.0)

    def run(self, progress=None, keep_params: bool = False, calibrate: bool = True) -> RankResult:
        c, span = self.cfg, self.span
        res = RankResult(rank=self.topo.rank)
        phases, totals = [], []
        points = {span.start + p for p in probe_steps(c.training.steps - span.start)} if calibrate else set()
        prober, start = Prober(c, self.strategy, self.tp_grads.partial_elements) if points else None, time.perf_counter()
        rates = offload_probe.measure(self.opt) if c.zero.offload_optimizer != "none" else None
        tracer = Tracer(c, Seat.of_grid(self.topo), span.start)
        for step in range(span.start, c.training.steps):
            if step in points:
                with timeline.span("probe", "probe", step=step):
                    res.probes.append({"step": step, "at_s": time.perf_counter() - start, **prober()})
            tracer.begin(step)          # last: the ranks it lets go start the step together
            t0 = time.time()
            ph, loss = span.timed(self.step, step, res, totals)
            t1 = time.time()
            if self.replica.stages is not None:
                res.timelines.append(self.schedule.events)
                if step == span.measured:
                    res.inflight = self.schedule.peak_inflight
            res.losses.append(self._mean_over_ranks(loss))   # bookkeeping: outside the meter
            phases.append(ph)
            validate(c, step, res, self.evaluate, start)
            res.skipped, res.loss_scale = self.scaler.skipped, float(self.scaler.scale)
            if checkpointing.due(c, step + 1):
                checkpointing.save_checkpoint(self, step + 1)
            tracer.end(step, ph, t0, t1)
            if progress is not None:
                progress(step, res)
        if c.training.steps in points:
            res.probes.append({"step": c.training.steps, "at_s": time.perf_counter() - start, **prober()})
        steady = summarise(res, totals, phases, self.strategy)
        res.timelines, res.stage = res.timelines[steady], self.topo.pp_rank
        res.sp_elements = self.tp_grads.partial_elements if self.cfg.parallel.sequence_parallel else None
        res.probe = median_rates(res.probes) if res.probes else {}
        res.trace = tracer.data
        if rates is not None:
            res.probe["offload"] = rates
        return self.finish(res, keep_params)

    def finish(self, res: RankResult, keep_params: bool) -> RankResult:
        """The full parameters when asked for, then release everything the run held."""
        res.nonfinite = list(self.nonfinite.steps)
        res.memory = memory_use.peak(next(self.model.parameters()).device)
        if self.saver is not None:              # the last save is complete before the run ends
            self.saver.wait()
            res.checkpoint = self.saver.summary()
        if keep_params:
            res.params = self.full_params()
        self.close()
        return res

    def close(self) -> None:
        self.opt.close()
        self.replica.close()

    def full_params(self) -> dict[str, list[float]]:
        """Every parameter of this rank's pipeline stage, its full value, by name (`Replica.full_params`)."""
        return self.replica.full_params()
