"""One step's predicted phases from the planner's counts and the in-run probes' rates.

Step time is predicted from the planner's counts and rates measured by probes (`train.probe`) at
points of the run itself (before the first step, after the last and about every 10 steps between:
2 to 16), every rank at once, never from the steps' own times; each rate is the median over the
points, and the JSON lists every point and the spread of the prediction it gives, so a load that
changed during the run shows there.

- Compute: the step's hardware FLOPs (6N per token, 8N with full recomputation, 6N + 4·L·s·h
  selective, plus the attention matmuls, 12·L·s·h; `plan.model.flops`) at the FLOP/s one block of the
  run's shape, dtype and recomputation reached in the probe (the median over every rank's points:
  ranks that share cores take turns at one of their own, `rates.pooled_flops`); under ZeRO-3 plus
  its all-gathers (below).
- Exposed communication: Σ over the step's collectives (`predict.calls`: which collective, how many
  elements of which size, how many times per step) of the seconds the same call took in the probe
  (same algorithm, dtype and communication thread), all of it counted as exposed, except ZeRO-3's
  all-gathers: forward and backward wait for a layer's weights, so those are predicted (and
  measured) inside compute, and the tensor-parallel collectives, each at its time alone times the
  ratio of a layer's collectives in the probe's tp pass to the same timed alone (`tp_in_step_ratio`,
  `probe_tp`: with more ranks than cores a tp group waits in them for a peer that has no core). Why
  a probe and not the α-β-γ model alone: the model's constants come from a separate calibration (or
  its defaults) on a machine that may have been quiet then and is loaded now (under load here, every
  probed call took about 4 ms whatever its size: one tick of this 250 Hz kernel's scheduler; the
  JSON's `probe` seconds per call of `ringzero train --nproc 4 --strategy zero2 --steps 20
  --json-report out/probe.json`, run beside another job that keeps every core busy), and
  from fp32 buffers, while a 16-bit reduction on a CPU runs at another speed; the probe times the
  real call under the run's load. It is still a prediction: the probe times each call alone, and the
  planner's counts say how many of each a step makes. Why no overlap is credited: the ranks share
  this machine's cores, so a collective that runs beside backward takes cores from it; the time it
  hides from the comm phase reappears in compute (measured compute above, exposed communication
  below the prediction, the step time close). The α-β-γ figure is kept in the JSON
  (`alpha_beta_gamma_comm_s`), and is the prediction, all of it exposed, when no probe ran.
- Straggler (`--straggler R:F`): a synchronous step ends together on every rank, so rank R's
  extra compute, (F - 1) x its compute, is on every rank's step: on R as the extra compute itself
  (`train.straggler`), on the others as waiting for R inside the step's collectives (the wait
  `twin.wait` predicts; Ho et al. 2013 §1). It is added once, whichever rank is priced.
  R's own compute is priced at the share of the cores it gets while its peers wait for it
  (`predict_straggler`, from the block timed alone on R beside the pooled rate).
- Gradient compression: its hook's compute per step as the probe timed it (`probe_compress`),
  counted with the exposed communication: the hook runs on the communication thread, on the cores
  backward uses, so (as above) no overlap is credited.
- Optimizer: the shard's parameters (`predict.optimizer_shard`) at the seconds per parameter the
  probe measured for `ShardedAdam.step` on shards of this rank's sizes and dtype (the norm's
  all-reduce, where ranks wait for each other, counts as communication).
"""

from __future__ import annotations

from ringzero.plan.model import flops
from ringzero.plan.strategies import tensor_parallel
from ringzero.plan.pipeline.layout import stage_flops_per_token
from ringzero.plan.pipeline.schedule import bubble_seconds
from ringzero.plan.model.shapes import param_count
from ringzero.twin import predict
from ringzero.twin import zero as report_zero
from ringzero.twin import pipeline as pipe
from ringzero.run.config import TrainConfig
from ringzero.twin.straggler import straggler_pass_seconds
from ringzero.twin.rates import call_key


def comm_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rates: dict,
                 sp_elements: int | None = None, rank: int = 0) -> dict:
    """One step's collectives: {"exposed": s, "in_compute": s (ZeRO-3's all-gathers and the tensor-
    parallel collectives, waited for inside forward and backward), "source"}, from the in-run probe's
    seconds per call times the planner's calls, or (when the probe did not time every call) the
    α-β-γ model's total, all exposed."""
    probed = rates.get("comm") or {}
    grouped = predict.grouped_calls(cfg, world, buckets, sp_elements, rank)
    keys = [call_key(c.collective, c.count, c.itemsize, group) for group, _, calls in grouped for c in calls]
    source = "in-run probe" if keys and all(k in probed for k in keys) else "alpha-beta-gamma model"
    out = {"exposed": 0.0, "in_compute": 0.0, "source": source}
    tp_alone = 0.0
    for group, n, calls in grouped:
        for collective, count, size, times, _ in calls:
            k = call_key(collective, count, size, group)
            seconds = probed[k] if source == "in-run probe" else \
                predict.call_seconds(cfg, group, collective, n, count * size)
            inside = group == "tp" or (cfg.sharding.shard_params and collective == "all_gather")
            probed_inside = inside and source == "in-run probe"     # the model's total stays all exposed
            out["in_compute" if probed_inside else "exposed"] += times * seconds
            tp_alone += times * seconds if probed_inside and group == "tp" else 0.0
    if source == "in-run probe" and "tp_layer_comm_s" in rates:
        out["in_compute"] += (tp_in_step_ratio(cfg, rates) - 1.0) * tp_alone
    return out


def tp_in_step_ratio(cfg: TrainConfig, rates: dict) -> float:
    """What a tp collective inside forward and backward costs in the step over what it costs timed
    alone: a layer's collectives in the probe's tp pass (`probe_tp`, every group at once) over the
    same collectives each timed alone. The embedding's, head's and loss's are the same rendezvous of
    the same group, so they are priced at the layers' ratio."""
    bsh = cfg.training.micro_batch * cfg.shape.seq * cfg.shape.hidden
    alone = sum(k * rates["comm"][call_key(c, bsh, cfg.value_bytes, "tp")]
                for _, c, k in tensor_parallel.layer_collectives(cfg.parallel.sequence_parallel, cfg.training.recompute))
    return max(0.0, rates["tp_layer_comm_s"]) / alone if alone > 0 else 1.0


def arithmetic_seconds(cfg: TrainConfig, world: int, rates: dict, rank: int = 0) -> float:
    """`rank`'s FLOPs of one step at the probed rate (1/t of its stage's under tensor parallelism);
    an injected straggler's from its rate alone and every rank's (`predict_straggler`)."""
    m = cfg.shape
    per_token = flops.step_flops_per_token(param_count(m).total, cfg.training.recompute, m)
    if cfg.parallel.pp > 1:                      # the stage's blocks, and the head on the last
        per_token = stage_flops_per_token(m, pipe.stage_of(cfg, world, rank), cfg.parallel.pp, cfg.parallel.virtual_stages,
                                          cfg.training.recompute)
    work = per_token * cfg.training.micro_batch * cfg.training.grad_accum * m.seq / cfg.parallel.tp   # tp splits the FLOPs
    together = work / rates["flops"]
    if cfg.faults.straggler is None or cfg.faults.straggler[0] != rank or "alone_flops" not in rates:
        return together
    return straggler_pass_seconds(work / rates["alone_flops"], together, world, cfg.faults.straggler[1])


def straggler_seconds(cfg: TrainConfig, world: int, rates: dict, in_compute: float) -> float:
    """The injected straggler's extra compute per step, (factor - 1) x its forward and backward
    (its stage's FLOPs, and `in_compute`: the collectives waited for inside them); 0 without one."""
    if cfg.faults.straggler is None or world == 1:
        return 0.0
    rank, factor = cfg.faults.straggler
    return (factor - 1.0) * (arithmetic_seconds(cfg, world, rates, rank) + in_compute)


def step_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rates: dict,
                 sp_elements: int | None = None, rank: int = 0) -> dict[str, float]:
    """The predicted phases of one step of `rank` at the probed `rates` (see the module doc):
    "compute" is "arithmetic" (`arithmetic_seconds`) plus "in_compute" (ZeRO-3's all-gathers, the
    tensor-parallel collectives); under a pipeline "bubble" is the stage's idle time, compute x
    f/(1-f) for the bubble fraction f; "straggler" the injected straggler's extra compute, which
    every rank's step waits for (`straggler_seconds`). "step" is the sum of the phases."""
    arithmetic = arithmetic_seconds(cfg, world, rates, rank)
    comm = comm_seconds(cfg, world, buckets, rates, sp_elements, rank)
    compute = arithmetic + comm["in_compute"]
    straggler = straggler_seconds(cfg, world, rates, comm["in_compute"])
    f = pipe.bubble(cfg) if cfg.parallel.pp > 1 else 0.0
    bubble = bubble_seconds(compute, f)
    compress = rates.get("compress_s", 0.0)     # the hook's compute, on the cores backward uses
    optimizer = predict.optimizer_shard(cfg, world, rank) * rates["optimizer_s_per_param"]
    if "offload" in rates:                  # the offloaded update's chunk loop or swap pipeline
        optimizer = report_zero.offload_update_seconds(cfg, world, buckets, rates)
    exposed = comm["exposed"] + compress
    return {"arithmetic": arithmetic, "in_compute": comm["in_compute"], "compute": compute, "bubble": bubble,
            "straggler": straggler, "comm": exposed, "compress": compress, "optimizer": optimizer,
            "step": compute + bubble + straggler + exposed + optimizer}


def unpriced(cfg: TrainConfig, world: int, cores: int) -> list[str]:
    """The terms this prediction leaves out for a run of `cfg` on `world` CPU ranks sharing `cores`
    cores, each a line naming it and which way it moves the measurement; [] when none is known.

    Both are contention for the cores, which the probe cannot see: it times every rank's block at
    once, the run's own steady state, and that is what compute is priced at."""
    out = []
    if cfg.sharding.shard_params and cfg.parallel.tp * cfg.parallel.pp == 1:
        # Measured: a layer's all-gather beside a block pass on the same cores took 2-4x as long as
        # alone, the pass 1.1-1.5x; compute +17 to +23 % (medians) in bf16, a third of that in fp32
        # (the compute twin of `ringzero train --nproc 4 --strategy zero3 --precision bf16 --steps 40`,
        # and of the same with `--precision fp32`).
        out.append("ZeRO-3's all-gathers run beside forward and backward on the same CPU cores and slow each "
                   "other (measured compute +17 to +23 % in bf16, about a third of that in fp32)")
    return out
