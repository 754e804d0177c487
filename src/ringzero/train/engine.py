"""The training loop that runs on every rank: build, train, evaluate, measure.

Order of application (torchtitan's): model -> precision (cast) -> tensor parallelism ->
recomputation -> pipeline cut (this rank's stage) -> sharding (DP/ZeRO over the dp group). Each step
runs its micro-batches through a step schedule (`step_schedule`; a pipeline's in
`pipeline_schedule`), then the optimizer; DP and ZeRO-1 communicate only on the last micro-batch
(under a pipeline, after its flush).
The run measures what the planner predicts: model-state bytes held, bytes saved for backward,
bytes sent and received (traffic meter), and time per phase. With `calibrate`, every rank also
probes this machine's rates at `probe.probe_steps` (before the first step, between steps, after the
last; never inside a timed step), so the prediction sees the load the steps saw.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm.timeline import Timeline
from ringzero.parallel.comm_queue import CommQueue
from ringzero.parallel.offload.optimizer import offloaded_adam
from ringzero.parallel.optimizer import AdamConfig
from ringzero.parallel.pp.pipeline import apply_pipeline
from ringzero.parallel.precision import LossScaler, NoScaler, dtype
from ringzero.parallel.recompute import apply_recompute
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.parallel.strategies import apply_sharding
from ringzero.parallel.tp.tensor_parallel import apply_tensor_parallel
from ringzero.parallel.tp.grads import TensorParallelGrads, unshard
from ringzero.parallel.topology import Topology
from ringzero.train import checkpointing, offload_probe, offloading
from ringzero.run import zero_options
from ringzero.run.config import TrainConfig
from ringzero.run.kind import RunKind
from ringzero.train.data import ByteData, load_bytes
from ringzero.train.model import GPT, AttentionCore
from ringzero.train.probe import Prober, probe_steps
from ringzero.twin.rates import median_rates
from ringzero.run.result import RankResult
from ringzero.train.pipeline_schedule import PipelineSchedule
from ringzero.train.step_schedule import GradAccumulation, StepHooks
from ringzero.train.nonfinite import NonFinite
from ringzero.train.straggler import straggle

MEASURE_STEP = 1
"""The step whose traffic and saved activations are measured (step 0 warms up; a one-step run
measures step 0)."""


class Trainer:
    def __init__(self, cfg: TrainConfig, topology: Topology) -> None:
        self.cfg, self.topo = cfg, topology
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.shape, attention=cfg.attention, dropout=cfg.dropout).to(dtype(cfg.precision))
        self.tp = apply_tensor_parallel(self.model, topology, sequence_parallel=cfg.sequence_parallel,
                                        algorithm=cfg.tp_algorithm, seed=cfg.seed)
        apply_recompute(self.model, cfg.recompute, (AttentionCore,), self.tp.rng.checkpoint_context
                        if topology.tp > 1 else None)
        self.stages = apply_pipeline(self.model, topology, cfg.virtual_stages, cfg.sequence_parallel,
                                     cfg.tp_algorithm) if topology.pp > 1 else None
        self.queue = CommQueue()
        self.strategy = apply_sharding(self.model, topology, ShardingConfig(
            sharding=cfg.sharding, bucket_mb=cfg.bucket_mb,
            algorithm=cfg.comm_algorithm, zeropp=zero_options.zeropp(cfg, topology.world),
            offload_params=offloading.param_offload(cfg)), self.queue)
        self.tp_grads = TensorParallelGrads(self.strategy, topology, cfg.tp_algorithm)
        self.opt = self._optimizer()
        self.scaler = LossScaler.from_config(cfg.loss_scaler) if cfg.precision == "fp16" else NoScaler()
        self.schedule = GradAccumulation() if self.stages is None else PipelineSchedule(
            self.stages, topology, cfg.schedule, cfg.virtual_stages, self._boundary_shape(),
            dtype(cfg.precision), cfg.pipeline_cost)
        if self.stages is not None:      # reduced after the pipeline's flush, never during backward
            self.strategy.accumulate_in_place()
        self._last_compute = 0.0
        self.data = ByteData(load_bytes(cfg.data, cfg.max_bytes), cfg.shape.seq, seed=cfg.seed)
        own = cfg.kind is not RunKind.PARAMETER_SERVER     # a parameter server's ranks checkpoint in `ps_checkpoint`
        self.start = checkpointing.load_checkpoint(self, cfg.resume) if cfg.resume is not None and own else 0
        if cfg.init_from is not None:
            checkpointing.init_weights(self, cfg.init_from)
        self.saver = checkpointing.Saver(self) if cfg.save_dir is not None and own else None
        self.nonfinite = NonFinite(cfg, topology, self.queue)
        self.set_start(self.start)

    def set_start(self, step: int) -> None:
        """Begin at `step` (a resumed run): the steps run, and the one whose traffic is measured."""
        self.start = step
        self.measure_step = step + min(MEASURE_STEP, self.cfg.steps - step - 1)

    def _optimizer(self):
        """This rank's optimizer over the weights it owns (a parameter server's worker has none)."""
        cfg, topology = self.cfg, self.topo
        return offloaded_adam(self.strategy.owned_weights(), adam_config(cfg),
                              offloading.optimizer_offload(cfg), self.tp_grads.sum_over_owners(),
                              self.tp_grads.counted if topology.tp * topology.pp > 1 else None,
                              rank=dist.get_rank() if dist.is_initialized() else 0)

    def _boundary_shape(self) -> tuple[int, int, int]:
        """What crosses a stage boundary per micro-batch: (b, s, h), (b, s/t, h) with sequence parallelism."""
        c = self.cfg
        return (c.micro_batch, c.shape.seq // (c.tp if c.sequence_parallel else 1), c.shape.hidden)

    def _micro_batches(self, step: int) -> list:
        c, t = self.cfg, self.topo
        x, y = self.data.batch("train", step, c.global_batch(t.world), t.dp_rank, t.dp)
        return list(zip(x.chunk(c.grad_accum), y.chunk(c.grad_accum)))

    def step(self, step: int, res: RankResult) -> tuple[dict[str, float], float]:
        """One optimizer step; returns (seconds per phase, this rank's mean loss)."""
        c, st = self.cfg, self.strategy
        hooks = StepHooks(self.model, measure=step == self.measure_step)
        # An injected straggler sleeps before its forward (for its previous step's compute), so that
        # its peers wait for it inside this step's collectives, where a slow GPU would hold them.
        slept = straggle(c, self.topo.rank, self._last_compute)
        self.nonfinite.before(step, st)
        losses = self.schedule.run(self.model, st, self._micro_batches(step), self.scaler.scale, hooks)
        # forward and backward only: a slow device computes longer, its collectives take as long
        self._last_compute = hooks.seconds["forward"] + hooks.seconds["backward"]
        if hooks.saved_bytes is not None:
            res.activations = hooks.saved_bytes
        if step == self.measure_step:
            res.held = {**st.held_bytes(), "optimizer": self.opt.state_bytes()}
            res.offload = {"optimizer": self.opt.placement_bytes(), "params": st.offload_bytes()}
        grads = st.reduced_grads()
        with hooks.phase("comm"):
            self.tp_grads.sync(grads)
        with hooks.phase("optimizer"):
            st.before_step()
            out = self.opt.step(grads, divisor=self.topo.dp * c.grad_accum,
                                loss_scale=self.scaler.scale, lr=c.lr_at(step))
        if step == self.measure_step:
            res.offload["disk_io"] = {"optimizer": self.opt.io_bytes(), "params": st.offload_io_bytes()}
        with hooks.phase("comm"):
            st.after_step()
        self.scaler.update(out["skipped"])
        self.nonfinite.after(step, out["skipped"], st)
        st.zero_grad()
        ph = hooks.seconds
        ph["straggler"] = slept                  # compute, made longer on purpose (`straggle`)
        ph["optimizer"] -= out["comm_s"]         # the norm's all-reduce is communication
        ph["comm"] += out["comm_s"]
        return ph, sum(losses) / len(losses) if losses else 0.0

    def timed_step(self, step: int, res: RankResult, totals: list[float]) -> tuple[dict[str, float], float]:
        """`step`, its seconds appended to `totals`; the measured step's traffic metered into `res`."""
        meter = comm.TrafficMeter() if step == self.measure_step else contextlib.nullcontext()
        t0 = time.perf_counter()
        with meter, Timeline() as calls:
            out = self.step(step, res)
        totals.append(time.perf_counter() - t0)
        res.calls.append(calls)
        if step == self.measure_step:
            res.traffic = meter.summary()
        return out

    def _mean_over_ranks(self, value: float) -> float:
        """The mean over the dp ranks of `value` (a pipeline's: the last stage's)."""
        t = torch.tensor([value], dtype=torch.float64)
        if self.topo.dp > 1:
            self.queue.submit(comm.all_reduce, t, op="avg", group=self.topo.group, algorithm="torch")
        if self.topo.pp > 1:             # only the last stage has it; the others add 0
            if self.topo.pp_rank != self.topo.pp - 1:
                t.zero_()
            self.queue.submit(comm.all_reduce, t, op="sum", group=self.topo.pp_group, algorithm="torch")
        self.queue.drain()
        return float(t)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        c, t = self.cfg, self.topo
        batches = [self.data.batch("val", i, c.micro_batch * t.dp, t.dp_rank, t.dp) for i in range(c.eval_batches)]
        if self.stages is None:
            losses = [self.model(x, y).item() for x, y in batches]
        else:
            losses = self.schedule.forward_only(batches)
        self.strategy.finish_backward()
        self.model.train()
        return self._mean_over_ranks(sum(losses) / len(losses) if losses else 0.0)

    def run(self, progress=None, keep_params: bool = False, calibrate: bool = True) -> RankResult:
        c = self.cfg
        res = RankResult(rank=self.topo.rank)
        phases, totals = [], []
        points = {self.start + p for p in probe_steps(c.steps - self.start)} if calibrate else set()
        prober, start = Prober(c, self.strategy, self.tp_grads.partial_elements) if points else None, time.perf_counter()
        rates = offload_probe.measure(self.opt) if c.offload_optimizer != "none" else None
        for step in range(self.start, c.steps):
            if step in points:
                res.probes.append({"step": step, "at_s": time.perf_counter() - start, **prober()})
            ph, loss = self.timed_step(step, res, totals)
            if self.stages is not None:
                res.timelines.append(self.schedule.events)
                if step == self.measure_step:
                    res.inflight = self.schedule.peak_inflight
            res.losses.append(self._mean_over_ranks(loss))   # bookkeeping: outside the meter
            phases.append(ph)
            if (step + 1) % c.eval_every == 0 or step + 1 == c.steps:
                res.val.append((step + 1, self.evaluate()))
                res.val_at_s.append(time.perf_counter() - start)
            res.skipped, res.loss_scale = self.scaler.skipped, float(self.scaler.scale)
            if checkpointing.due(c, step + 1):
                checkpointing.save_checkpoint(self, step + 1)
            if progress is not None:
                progress(step, res)
        if c.steps in points:
            res.probes.append({"step": c.steps, "at_s": time.perf_counter() - start, **prober()})
        steady = self.summarise(res, totals, phases)
        res.timelines, res.stage = res.timelines[steady], self.topo.pp_rank
        res.sp_elements = self.tp_grads.partial_elements if self.cfg.sequence_parallel else None
        res.probe = median_rates(res.probes) if res.probes else {}
        if rates is not None:
            res.probe["offload"] = rates
        return self.finish(res, keep_params)

    def summarise(self, res: RankResult, totals: list[float], phases: list[dict]) -> slice:
        """Step times and per-phase medians of the steady steps (warm-up left out when there are
        enough steps) and the bucket layout, into `res`; returns the steady slice."""
        steady = slice(min(2, len(totals) - 1), None)
        res.step_times, res.calls = totals[steady], res.calls[steady]
        res.step_time = statistics.median(res.step_times)
        res.phases = {k: statistics.median(p[k] for p in phases[steady]) for k in phases[0]}
        res.buckets = self.strategy.layout()
        return steady

    def finish(self, res: RankResult, keep_params: bool) -> RankResult:
        """The full parameters when asked for, then release everything the run held."""
        res.nonfinite = list(self.nonfinite.steps)
        if self.saver is not None:              # the last save is complete before the run ends
            self.saver.wait()
            res.checkpoint = self.saver.summary()
        if keep_params:
            res.params = self.full_params()
        self.close()
        return res

    def close(self) -> None:
        if self.opt is not None:             # a parameter server's worker has no optimizer
            self.opt.close()
        self.strategy.close()
        self.queue.close()

    def full_params(self) -> dict[str, list[float]]:
        """Every parameter of this rank's pipeline stage, its full value (gathered over dp when
        sharded, over tp when split), by name, as flat float lists."""
        params = dict(self.model.named_parameters())
        return {k: unshard(v, params[k], self.topo, self.cfg.tp_algorithm).float().reshape(-1).tolist()
                for k, v in self.strategy.full_params().items()}


def adam_config(cfg: TrainConfig) -> AdamConfig:
    return AdamConfig(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, clip=cfg.clip)
