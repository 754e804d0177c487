"""What this machine's ranks can do at once, probed at several points of a training run. The rates
calibrate the step-time prediction of `twin.step`; the steps themselves are never used for it.

A machine that others share changes its load while a run trains, so one probe before or after the
run measures a different machine than the steps saw. `Prober` is built once per run and called at
the points `probe_steps` spreads over it (before the first step, between steps, after the last).
Every rank probes at the same points, after a barrier, so the ranks contend for the cores as their
steps do. Everything runs in the run's own precision, shapes and algorithms:

- Compute: one transformer block of the run's shape, dtype, attention, dropout and recomputation,
  forward and backward on one micro-batch; its hardware FLOPs (the per-layer share of the model's
  `plan.model.flops` formula) over the time. Small and skinny matmuls, softmax, norms and autograd's own
  overhead run well below a large matmul's peak on a CPU (2x for this model), and 16-bit arithmetic
  on a CPU without native support far below fp32, so the block reaches the rate the model's layers
  do. Two small biases remain and partly cancel: the lone block runs with its weights and
  activations hot in cache, and the rest of the model (embedding lookups, tied head, loss) is
  counted at 6 FLOPs per parameter, more than a lookup does. Timed interleaved on one rank at
  nano's shape, the model took -4 % to +9 % of what the block's rate predicts (fp32 and bf16: the
  compute twin of `ringzero train --strategy single --steps 40`, and with `--precision bf16`).
- An injected straggler's rank times the block once more while every other rank waits at a
  barrier (`alone_flops`): it computes while they wait for it, with the cores to itself
  (`predict_straggler`).
- Under tensor parallelism the block is timed a second time split over the tp group with its
  collectives (`probe_tp`): what a layer's collectives cost inside the step (`tp_layer_comm_s`).
- Optimizer: `ShardedAdam.step` itself on synthetic shards of this rank's sizes and dtype (16-bit:
  the norm over 16-bit gradients, the chunked upcast, the fp32 master update and the write-back),
  at most `OPT_MAX_PARAMS` parameters, clipping when the run clips; seconds per parameter. Its norm
  all-reduce is not run (it is communication).
- Communication: each distinct collective of the step (`predict.calls`: collective, elements,
  element size) on fresh buffers of the run's dtype, issued on the engine's communication thread
  with the run's algorithm, so it takes the path a step's collectives take.
- Gradient compression: its hook's compute over the bucket layout, nothing sent (`probe_compress`).

Each figure is the median of `COMPUTE_REPS`, `OPT_REPS`, `COMM_REPS` calls.

The first point first runs each path once (`warmup_s`: autograd's and checkpoint's first use take
seconds, the collectives open their connections); that is time the first step would spend anyway,
so it is reported apart from `cost_s`, what each point adds to the run.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from ringzero import comm
from ringzero.parallel.optimizer import AdamConfig, ShardedAdam
from ringzero.parallel.precision import dtype as dtype_of
from ringzero.parallel.recompute import apply_recompute
from ringzero.plan.model import flops
from ringzero.twin import predict
from ringzero.run.config import TrainConfig
from ringzero.parallel.compression.cast16 import DTYPES
from ringzero.train.probe_compress import CompressProbe
from ringzero.train.probe_tp import TPLayerPass
from ringzero.twin.rates import call_key
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import PROBE

PROBE_EVERY, MAX_POINTS = 10, 16
"""About one probe point per `PROBE_EVERY` steps, at least two (before the first step and after the
last), at most `MAX_POINTS`. Many short points track a changing load better than a few long ones:
the load varies far more between points than the repetitions of one point do."""
COMPUTE_REPS, OPT_REPS, COMM_REPS = 1, 3, 1
"""Timed calls per point of a block's forward + backward (at least), an optimizer step, each
collective."""
COMPUTE_WINDOW_S = 0.03
"""A point's block passes go on for at least this long: the steps keep every rank busy at once,
and so must the probe. With more ranks than cores, a pass shorter than the scheduler's time slice
(a few ms) may run on a core of its own while a peer waits to start: 3 ranks on 2 cores in bf16
(nano, micro-batch 4: ~8 ms a pass) were predicted at their 2-rank speed, 59-64 % faster than they
ran (the compute twin of `ringzero train --nproc 3 --precision bf16 --micro-batch 4 --steps 40`
with this window at 0)."""
OPT_MAX_PARAMS = 2**22
TP_REPS = 2
"""Tensor-parallel passes per point (`probe_tp`), at least: a pass holds 8 rendezvous of its group
(nano: 40-70 ms a pass beyond its arithmetic, 4 ranks on 2 cores: `tp_layer_comm_s` in the JSON's
`probe` of `ringzero train --nproc 4 --tp 2 --steps 40 --json-report out/tp.json`), and one pass a
point varied most."""


def probe_steps(steps: int) -> list[int]:
    """The steps before which the ranks probe (`steps` itself: after the last one), evenly spread."""
    points = min(MAX_POINTS, max(2, steps // PROBE_EVERY + 1))
    return sorted({round(i * steps / (points - 1)) for i in range(points)})


def _shards(sizes: list[int], dt: torch.dtype, norm: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Synthetic (weights, gradients) of these sizes, the gradients of global norm `norm`."""
    weights = [torch.randn(n).to(dt) for n in sizes]
    grads = [torch.randn(n) for n in sizes]
    scale = norm / math.sqrt(sum(float(g.square().sum()) for g in grads))
    return weights, [g.mul_(scale).to(dt) for g in grads]


def _local_block(block: nn.Module, m, t: int) -> nn.Module:
    """`block` cut to one tensor-parallel rank's matrices (Megatron's split: q, k, v and the first MLP
    matrix by columns, the output projections by rows), without the collectives: the compute a tp
    rank does, whose FLOPs are 1/t of the block's."""
    if t == 1:
        return block
    h, f, bias = m.hidden, m.ffn_dim, m.bias
    block.attn.qkv, block.attn.proj = nn.Linear(h, 3 * h // t, bias=bias), nn.Linear(h // t, h, bias=bias)
    block.mlp.fc, block.mlp.proj = nn.Linear(h, f // t, bias=bias), nn.Linear(f // t, h, bias=bias)
    return block


def _seconds(fn, reps: int) -> float:
    """Median seconds of `reps` calls of `fn` (the steps are summarised by their median too, so a
    call the scheduler preempted weighs no more than a step it preempted)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pass_seconds(fn, reps: int = COMPUTE_REPS) -> float:
    """Seconds per call of `fn` over at least `reps` calls back to back for `COMPUTE_WINDOW_S`."""
    passes, t0 = 0, time.perf_counter()
    while True:
        fn()
        passes += 1
        elapsed = time.perf_counter() - t0
        if passes >= reps and elapsed >= COMPUTE_WINDOW_S:
            return elapsed / passes


def _agreed_pass_seconds(fn, reps: int, group) -> float:
    """`_pass_seconds` of a pass with collectives in it. Every rank of `group` must run it the same
    number of times: one that stopped on its own clock would leave a peer waiting in the next
    pass's collective for good (the run would hang until its timeout). So one pass is timed first,
    and the count is the most any rank's first pass asks for, agreed by one all-reduce outside the
    timed passes."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    want = torch.tensor([max(reps, math.ceil(COMPUTE_WINDOW_S / max(first, 1e-9)))], dtype=torch.int64)
    dist.all_reduce(want, op=dist.ReduceOp.MAX, group=group)
    passes = int(want.item())
    t0 = time.perf_counter()
    for _ in range(passes):
        fn()
    return (time.perf_counter() - t0) / passes


def _collective(name: str, elements: int, dt: torch.dtype, n: int, group, algorithm: str):
    """A call of `name` on fresh zero buffers, sized as `predict.calls` counts it."""
    if name == "all_reduce":
        t = torch.zeros(elements, dtype=dt)
        return lambda: comm.all_reduce(t, op="sum", group=group, algorithm=algorithm)
    full, part = torch.zeros(elements, dtype=dt), torch.zeros(elements // n, dtype=dt)
    if name == "reduce_scatter":
        return lambda: comm.reduce_scatter_tensor(part, full, op="sum", group=group, algorithm=algorithm)
    if name == "all_gather":
        return lambda: comm.all_gather_into_tensor(full, part, group=group, algorithm=algorithm)
    if name == "all_to_all":
        sends, recvs = list(full.view(n, -1)), list(torch.zeros(elements, dtype=dt).view(n, -1))
        return lambda: comm.all_to_all(recvs, sends, group=group, algorithm=algorithm)
    raise ValueError(f"no probe for collective {name!r}")


def _time_calls(calls: dict[str, object]) -> dict[str, float]:
    return {key: _seconds(fn, COMM_REPS) for key, fn in calls.items()}


class Prober:
    """This rank's probes for one run of `cfg` under `strategy` (see the module doc)."""

    def __init__(self, cfg: TrainConfig, strategy, sp_elements: int | None = None) -> None:
        from ringzero.train.model import AttentionCore, Block
        self.cfg, self.strategy, self.dtype = cfg, strategy, dtype_of(cfg.optim.precision)
        self.queue, self.sp_elements = strategy.queue, sp_elements
        m = cfg.shape
        torch.manual_seed(0)
        holder = nn.ModuleList([_local_block(Block(m, cfg.model.attention, cfg.model.dropout), m, cfg.parallel.tp).to(self.dtype)])
        apply_recompute(holder, cfg.training.recompute, (AttentionCore,))
        self.block = holder[0]
        self.x = torch.randn(cfg.training.micro_batch, m.seq, m.hidden).to(self.dtype).requires_grad_()
        self.grad = torch.randn_like(self.x)      # (b, s, h), dense as the next layer's gradient is
        self.work = flops.layer_flops_per_token(m, cfg.training.recompute) * cfg.training.micro_batch * m.seq / cfg.parallel.tp
        sizes, total = [], 0
        for shard in strategy.owned_weights():
            n = min(shard.numel(), OPT_MAX_PARAMS - total)
            if n <= 0:
                break
            sizes.append(n)
            total += n
        self.opt_params = total
        # Clipping bites in most steps of a run that clips (here the gradient norm stays above 1
        # in about 3/4 of the first 60 steps), so it bites in the probe too: gradients of norm
        # `clip` divided by 0.5 have norm 2·clip and are scaled by 1/2, every call (fp32 divides
        # and scales them in place, so each call leaves them at norm `clip` again).
        self.divisor = 0.5 if cfg.optim.clip else 1.0
        weights, self.grads = _shards(sizes, self.dtype, cfg.optim.clip or 1.0)
        self.opt = ShardedAdam(weights, AdamConfig(          # alone: the norm's all-reduce does not run
            lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay, clip=cfg.optim.clip))
        self.calls = self._calls()
        topo = strategy.topology
        self.tp_pass = TPLayerPass(cfg, topo, self.dtype) if cfg.parallel.tp > 1 and dist.is_initialized() else None
        hooked = strategy.comm_hook.hook is not None and topo.dp > 1
        self.compress = CompressProbe(strategy) if hooked else None
        self.warm = False

    def _calls(self) -> dict[str, object]:
        st, topo = self.strategy, self.strategy.topology
        groups = {"dp": st.group, "tp": topo.tp_group, "tp_step": topo.tp_group, "embedding": topo.embedding_group,
                  "pp_step": topo.pp_group, "dp_node": topo.dp_node_group, "dp_cross": topo.dp_cross_group}
        algorithms = {g: (st.config.algorithm_for if g in predict.DP_GROUPS else lambda _: self.cfg.parallel.tp_algorithm)
                      for g in groups}
        out = {}
        for group, n, calls in predict.grouped_calls(self.cfg, topo.world, st.layout(), self.sp_elements, topo.rank):
            for collective, elements, itemsize, *_ in calls:
                key = call_key(collective, elements, itemsize, group)
                # 1: ZeRO++'s codes, top-k's packed pairs; 2 under fp16/bf16 compression: its type
                dt = {4: torch.float32, 1: torch.uint8}.get(itemsize, self.dtype)
                if itemsize == 2 and group in predict.DP_GROUPS and self.cfg.compress.compress in DTYPES:
                    dt = DTYPES[self.cfg.compress.compress]
                if key not in out:
                    out[key] = _collective(collective, elements, dt, n, groups[group],
                                           algorithms[group](collective))
        return out

    def _pass(self) -> None:
        # Not .sum().backward(): its gradient is an expanded (stride-0) tensor, and in bf16 the
        # matmuls of backward take a path 1.18x slower with it than with the dense gradient a block
        # inside the model receives. Gradients start from None, as the engine's hooks leave them.
        self.block.zero_grad(set_to_none=True)
        self.x.grad = None
        self.block(self.x).backward(self.grad)

    def _block_rate(self) -> float:
        """FLOP/s of the block over passes back to back for `COMPUTE_WINDOW_S` (see there)."""
        return self.work / _pass_seconds(self._pass)

    def _warm_up(self) -> float:
        """First use of every probed path (autograd, checkpoint, kernels, the optimizer's state, the
        collectives' connections): seconds the run's first step would otherwise spend."""
        t0 = time.perf_counter()
        self._pass()
        if self.tp_pass is not None:
            self.tp_pass()
        self.opt.step(self.grads, divisor=self.divisor)
        for fn in self.calls.values():
            self.queue.submit(fn).result()
        return time.perf_counter() - t0

    @tagged(PROBE)
    def __call__(self) -> dict:
        """{"flops": FLOP/s, "optimizer_s_per_param": s, "comm": {call_key: s}, "cost_s": seconds
        this point took, "warmup_s": seconds of first use (the first point only)}."""
        self.queue.drain()
        warmup = 0.0 if self.warm else self._warm_up()
        self.warm = True
        t0 = time.perf_counter()
        everyone = self.strategy.topology.grid_group
        if dist.is_initialized() and self.strategy.topology.world > 1:
            dist.barrier(everyone)
        rate = self._block_rate()
        extra = {}
        if self.tp_pass is not None:         # the tp groups' layers at once, their peers in step
            dist.barrier(everyone)
            extra["tp_layer_comm_s"] = _agreed_pass_seconds(self.tp_pass, TP_REPS, everyone) - self.work / rate
        alone = self._straggler_alone(everyone)
        if alone is not None:
            extra["alone_flops"] = alone
        opt_s = _seconds(lambda: self.opt.step(self.grads, divisor=self.divisor), OPT_REPS) / self.opt_params
        timed = {}
        if self.calls:                 # together again: no rank's first call waits for a slower one
            dist.barrier(everyone)
            timed = self.queue.submit(_time_calls, self.calls).result()
        self.queue.drain()
        if self.compress is not None:
            extra["compress_s"] = self.compress()
        return {"flops": rate, "optimizer_s_per_param": opt_s, "comm": timed,
                "cost_s": time.perf_counter() - t0, "warmup_s": warmup, **extra}

    def _straggler_alone(self, everyone) -> float | None:
        """An injected straggler computes while its peers wait for it (`predict_straggler`), so on
        its rank the block is timed a second time with every other rank held at a barrier: the
        rate of a rank with the cores to itself. None on the other ranks and without a straggler."""
        topo = self.strategy.topology
        if self.cfg.faults.straggler is None or not dist.is_initialized() or topo.world == 1:
            return None
        dist.barrier(everyone)
        rate = self._block_rate() if topo.rank == self.cfg.faults.straggler[0] else None
        dist.barrier(everyone)
        return rate
