"""Predicted beside measured: the table (and JSON) that closes every training run.

Each row is a twin: a quantity `ringzero.plan` predicts for this exact configuration and the same
quantity measured on the ranks, with the relative error (measured - predicted) / predicted, + when
the measurement is above the prediction (`ERROR_DEFINITION`, printed under the table and written in
the JSON). Figures are the busiest rank's (the maximum over ranks), per step or per micro-batch
as named. Memory, activations and bytes on the wire are exact formulas of the configuration.

Step time is predicted from the planner's counts and rates measured by probes (`train.probe`) at
points of the run itself (before the first step, after the last and about every 10 steps between:
2 to 16), every rank at once, never from the steps' own times; each rate is the median over the
points, and the JSON lists every point and the spread of the prediction it gives, so a load that
changed during the run shows there.

- Compute: the step's hardware FLOPs (6N per token, 8N with full recomputation, 6N + 4·L·s·h
  selective, plus the attention matmuls, 12·L·s·h; `plan.flops`) at the FLOP/s one block of the
  run's shape, dtype and recomputation reached in the probe (the median over every rank's points:
  ranks that share cores take turns at one of their own, `probe.pooled_flops`); under ZeRO-3 plus
  its all-gathers (below).
- Exposed communication: Σ over the step's collectives (`predict.calls`: which collective, how many
  elements of which size, how many times per step) of the seconds the same call took in the probe
  (same algorithm, dtype and communication thread), all of it counted as exposed, except ZeRO-3's
  all-gathers: forward and backward wait for a layer's weights, so those are predicted (and
  measured) inside compute. Why a probe and not the α-β-γ model alone: the model's constants come
  from a separate calibration (or its defaults) on a machine that may have been quiet then and is
  loaded now (under load here, every probed call took about 4 ms whatever its size: one tick of this
  250 Hz kernel's scheduler), and from fp32 buffers, while a 16-bit reduction on a CPU runs at
  another speed; the probe times the real call under the run's load. It is still a prediction: the
  probe times each call alone, and the planner's counts say how many of each a step makes. Why no
  overlap is credited: the ranks share this machine's cores, so a collective that runs beside
  backward takes cores from it; the time it hides from the comm phase reappears in compute (measured
  compute above, exposed communication below the prediction, the step time close). The α-β-γ figure
  is kept in the JSON (`alpha_beta_gamma_comm_s`), and is the prediction, all of it exposed, when no
  probe ran.
- Optimizer: the shard's parameters (`predict.optimizer_shard`) at the seconds per parameter the
  probe measured for `ShardedAdam.step` on shards of this rank's sizes and dtype (the norm's
  all-reduce, where ranks wait for each other, counts as communication).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from ..plan import flops
from ..plan.pipeline_layout import stage_flops_per_token
from ..plan.shapes import param_count
from . import predict, report_zero
from . import predict_pipeline as pipe
from .config import TrainConfig
from .engine import RankResult
from .probe import call_key, pooled_flops

ERROR_DEFINITION = (
    "error = (measured - predicted) / predicted: + means the measurement is above the prediction "
    "(slower or larger; for tokens per second, faster), - below. Exposed communication is the time "
    "of a step not spent in forward, backward or the optimizer: communication that compute did not "
    "hide (the last gradient buckets, ZeRO-1/2's all-gather after the update, the gradient norm's "
    "all-reduce, and waiting for slower ranks). ZeRO-3's all-gathers of a layer's weights run inside "
    "forward and backward: predicted and measured as compute.")


@dataclass(frozen=True)
class Twin:
    name: str
    predicted: float
    measured: float | None
    """None where the run cannot measure it (the backend's own collectives are opaque to the meter)."""
    unit: str

    @property
    def error(self) -> float | None:
        if not self.predicted or self.measured is None:
            return None
        return (self.measured - self.predicted) / self.predicted

    def to_json(self) -> dict:
        return {"predicted": self.predicted, "measured": self.measured, "unit": self.unit, "error": self.error}


def comm_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rates: dict,
                 sp_elements: int | None = None, rank: int = 0) -> dict:
    """One step's collectives: {"exposed": s, "in_compute": s (ZeRO-3's all-gathers and the tensor-
    parallel collectives, waited for inside forward and backward), "source"}, from the in-run probe's
    seconds per call times the planner's calls, or (when the probe did not time every call) the
    α-β-γ model's total, all exposed."""
    probed = rates.get("comm") or {}
    grouped = predict.grouped_calls(cfg, world, buckets, sp_elements, rank)
    keys = [call_key(c, n, size, group) for group, _, calls in grouped for c, n, size, _ in calls]
    source = "in-run probe" if keys and all(k in probed for k in keys) else "alpha-beta-gamma model"
    out = {"exposed": 0.0, "in_compute": 0.0, "source": source}
    for group, n, calls in grouped:
        for collective, count, size, times in calls:
            k = call_key(collective, count, size, group)
            seconds = probed[k] if source == "in-run probe" else \
                predict.call_seconds(cfg, group, collective, n, count * size)
            inside = group == "tp" or (predict.strategy(cfg).shard_params and collective == "all_gather")
            probed_inside = inside and source == "in-run probe"     # the model's total stays all exposed
            out["in_compute" if probed_inside else "exposed"] += times * seconds
    return out


def step_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rates: dict,
                 sp_elements: int | None = None, rank: int = 0) -> dict[str, float]:
    """The predicted phases of one step of `rank` at the probed `rates` (see the module doc):
    "compute" is "arithmetic" (this rank's FLOPs at the probed rate: 1/t of its stage's under tensor
    parallelism) plus "in_compute" (ZeRO-3's all-gathers, the tensor-parallel collectives); under a
    pipeline "bubble" is the stage's idle time, compute x f/(1-f) for the bubble fraction f."""
    m = cfg.shape
    per_token = flops.step_flops_per_token(param_count(m).total, cfg.recompute, m)
    if cfg.pp > 1:                      # the stage's blocks, and the head on the last
        per_token = stage_flops_per_token(m, pipe.stage_of(cfg, world, rank), cfg.pp, cfg.virtual_stages,
                                          cfg.recompute)
    tokens = cfg.micro_batch * cfg.grad_accum * m.seq
    arithmetic = per_token * tokens / cfg.tp / rates["flops"]      # tensor parallelism splits the FLOPs
    comm = comm_seconds(cfg, world, buckets, rates, sp_elements, rank)
    compute = arithmetic + comm["in_compute"]
    f = pipe.bubble(cfg) if cfg.pp > 1 else 0.0
    bubble = compute * f / (1 - f)
    optimizer = predict.optimizer_shard(cfg, world, rank) * rates["optimizer_s_per_param"]
    if "offload" in rates:                  # the offloaded update's chunk loop or swap pipeline
        optimizer = report_zero.offload_update_seconds(cfg, world, buckets, rates)
    return {"arithmetic": arithmetic, "in_compute": comm["in_compute"], "compute": compute, "bubble": bubble,
            "comm": comm["exposed"], "optimizer": optimizer, "step": compute + bubble + comm["exposed"] + optimizer}


def _busiest(results: list[RankResult]) -> RankResult:
    return max(results, key=lambda r: r.step_time)


def _pooled(results: list[RankResult]) -> bool:
    n = len(results[0].probes)
    return n > 0 and all(len(r.probes) == n for r in results)


def run_rates(results: list[RankResult]) -> dict:
    """The busiest rank's probed rates, but the block's FLOP/s over every rank's points
    (`probe.pooled_flops`: ranks that share cores take turns at a core of their own)."""
    own = _busiest(results).probe
    return {**own, "flops": pooled_flops([r.probes for r in results])} if _pooled(results) else own


def _stats(xs: list[float]) -> dict[str, float]:
    mid = statistics.median(xs)
    return {"min": min(xs), "median": mid, "max": max(xs), "spread": (max(xs) - min(xs)) / mid if mid else 0.0}


def probe_summary(cfg: TrainConfig, world: int, results: list[RankResult]) -> dict:
    """The busiest rank's (the table's) probe points with the prediction each one alone gives, the
    spread ((max - min) / median) of the rates, of those predictions and of the measured steps
    ("measured_step"), and what probing cost against the steps' time."""
    res, pooled = _busiest(results), _pooled(results)
    points = [{**p, "flops": pooled_flops([r.probes for r in results], i) if pooled else p["flops"]}
              for i, p in enumerate(res.probes)]
    points = [{**p, "predicted": step_seconds(cfg, world, res.buckets, p, res.sp_elements, res.rank)}
              for p in points]
    if not points:
        return {"points": [], "spread": {}, "cost_s": 0.0, "cost_fraction": 0.0}
    spread = {k: _stats([p[k] for p in points]) for k in ("flops", "optimizer_s_per_param")}
    spread |= {k: _stats([p["predicted"][k] for p in points]) for k in ("compute", "comm", "optimizer", "step")}
    if res.step_times:
        spread["measured_step"] = _stats(res.step_times)
    cost = sum(p["cost_s"] for p in points)
    return {"points": points, "spread": spread, "cost_s": cost,
            "cost_fraction": cost / (cfg.steps * res.step_time) if res.step_time else 0.0}


def twins(cfg: TrainConfig, world: int, results: list[RankResult]) -> list[Twin]:
    busiest = _busiest(results)
    states = [predict.states(cfg, world, r.rank) for r in results]
    sent = [predict.traffic(cfg, world, r.buckets, r.rank, r.sp_elements) for r in results]
    total_sent = [sum(op["bytes_sent"] for op in r.traffic.get("ops", {}).values()) for r in results]
    total_recv = [sum(op["bytes_recv"] for op in r.traffic.get("ops", {}).values()) for r in results]
    steps = step_seconds(cfg, world, busiest.buckets, run_rates(results), busiest.sp_elements, busiest.rank)
    tokens = cfg.global_batch(world) * cfg.shape.seq
    rows = [Twin(f"{name} held", max(s[key] for s in states), max(r.held[key] for r in results), "bytes")
            for name, key in (("parameters", "params"), ("gradients", "grads"), ("optimizer states", "optimizer"))]
    if cfg.pp == 1:
        rows.append(Twin("activations saved (one micro-batch)", predict.activations(cfg),
                         max(r.activations for r in results), "bytes"))
    if world > 1:
        opaque = cfg.comm_algorithm == "torch"      # predicted as the backend's ring, not metered
        rows += [Twin("bytes sent per step", max(s["bytes_sent"] for s in sent),
                      None if opaque else max(total_sent), "bytes"),
                 Twin("bytes received per step", max(s["bytes_recv"] for s in sent),
                      None if opaque else max(total_recv), "bytes")]
    rows += report_zero.link_twins(cfg, world, results) + report_zero.zeropp_twins(cfg, world, results) \
        + report_zero.offload_twins(cfg, world, results)
    if cfg.pp > 1:
        rows += pipeline_twins(cfg, world, results)
    rows += [
        Twin("compute per step", steps["compute"], busiest.phases["forward"] + busiest.phases["backward"], "s"),
        Twin("exposed communication per step", steps["comm"], busiest.phases["comm"], "s"),
        Twin("optimizer per step", steps["optimizer"], busiest.phases["optimizer"], "s"),
    ]
    if cfg.pp > 1:
        rows.append(Twin("pipeline wait per step", steps["bubble"], busiest.phases["pipeline_wait"], "s"))
    from . import report_wait                  # it builds on this module's Twin
    rows += report_wait.twins(cfg, world, results)
    rows += [
        Twin("step time", steps["step"], busiest.step_time, "s"),
        Twin("tokens per second", tokens / steps["step"], tokens / busiest.step_time, "tokens/s"),
    ]
    return [r for r in rows if world > 1 or "communication" not in r.name]


def _stage_ranks(cfg: TrainConfig, world: int, results: list[RankResult]) -> list[RankResult]:
    """One rank per pipeline stage (dp and tp coordinate 0), in stage order."""
    pl = cfg.placement(world)
    return sorted((r for r in results if pl.coords(r.rank)["dp"] == 0 and pl.coords(r.rank)["tp"] == 0),
                  key=lambda r: pl.coords(r.rank)["pp"])


def pipeline_twins(cfg: TrainConfig, world: int, results: list[RankResult]) -> list[Twin]:
    """The pipeline's twins: bytes over a stage boundary (all stages' point-to-point bytes over the
    p·v - 1 chunk boundaries), the idle fraction of a step (median over steady steps), and per stage
    the micro-batches and activation bytes held at the peak and the parameters held."""
    stages = _stage_ranks(cfg, world, results)
    p2p = sum(r.traffic.get("ops", {}).get("send_recv/p2p", {}).get("bytes_sent", 0) for r in stages)
    boundaries = cfg.pp * cfg.virtual_stages - 1
    sent = [(pipe.p2p_traffic(cfg, r.stage)["bytes_sent"],
             r.traffic.get("ops", {}).get("send_recv/p2p", {}).get("bytes_sent", 0)) for r in stages]
    rows = [Twin("pipeline bytes per stage boundary", pipe.boundary_bytes(cfg), p2p / boundaries, "bytes"),
            Twin("pipeline bytes sent per step (busiest stage)", max(p for p, _ in sent), max(m for _, m in sent),
                 "bytes"),
            Twin("pipeline idle fraction", pipe.bubble(cfg), pipe.measured_bubble([r.timelines for r in stages]),
                 "fraction")]
    for r in stages:
        i = r.stage
        rows += [Twin(f"stage {i}: micro-batches held at peak", pipe.inflight(cfg, i), r.inflight, "chunks"),
                 Twin(f"stage {i}: activations held at peak", predict.activations(cfg, stage=i), r.activations,
                      "bytes"),
                 Twin(f"stage {i}: parameters held", predict.states(cfg, world, r.rank)["params"], r.held["params"],
                      "bytes")]
    return rows


def to_json(cfg: TrainConfig, world: int, results: list[RankResult], rows: list[Twin],
            probes: dict | None = None) -> dict:
    """The report as plain data (`probes`: `probe_summary`'s, when the caller has it already)."""
    r0, busiest, probed = results[0], _busiest(results), run_rates(results)
    return {"schema": "ringzero.train-report/2", "config": dataclasses.asdict(cfg), "world": world,
            "losses": r0.losses, "val": [{"step": s, "loss": v} for s, v in r0.val],
            "error_definition": ERROR_DEFINITION,
            "twins": {t.name: t.to_json() for t in rows}, "skipped_steps": r0.skipped,
            "predicted_phases": step_seconds(cfg, world, busiest.buckets, probed, busiest.sp_elements, busiest.rank),
            "probe": probed, "probes": probes or probe_summary(cfg, world, results),
            "communication_model": comm_seconds(cfg, world, busiest.buckets, probed, busiest.sp_elements,
                                                busiest.rank)["source"],
            "alpha_beta_gamma_comm_s": predict.comm_seconds(cfg, world, busiest.buckets, busiest.sp_elements,
                                                            busiest.rank),
            "pipeline": _pipeline_json(cfg, world, results),
            "ranks": [_rank_json(r) for r in results]}


def _pipeline_json(cfg: TrainConfig, world: int, results: list[RankResult]) -> dict | None:
    """The measured schedule of the last steady step, stage by stage (what `--pipeline-plot` draws)."""
    if cfg.pp == 1:
        return None
    stages = _stage_ranks(cfg, world, results)
    return {"schedule": cfg.schedule, "virtual_stages": cfg.virtual_stages, "micro_batches": cfg.grad_accum,
            "idle_fraction": {"predicted": pipe.bubble(cfg),
                              "measured": pipe.measured_bubble([r.timelines for r in stages])},
            "timeline": [[{"kind": k, "micro": mb, "chunk": c, "start": t0, "end": t1}
                          for k, mb, c, t0, t1 in (r.timelines[-1] if r.timelines else [])] for r in stages]}


def _rank_json(r: RankResult) -> dict:
    """What one rank measured (the table shows the busiest; this is every rank)."""
    ops = r.traffic.get("ops", {}).values()
    return {"rank": r.rank, "step_time": r.step_time, "phases": r.phases, "held": r.held,
            "activations": r.activations, "bytes_sent": sum(op["bytes_sent"] for op in ops),
            "bytes_recv": sum(op["bytes_recv"] for op in ops), "skipped_steps": r.skipped}


def caption(probes: dict | None = None) -> str:
    """What the table's numbers mean, and how much the probed prediction moved during the run."""
    text = ERROR_DEFINITION
    step = (probes or {}).get("spread", {}).get("step")
    if step:
        text += (f" Step time predicted at each of the {len(probes['points'])} probe points: "
                 f"{step['min'] * 1e3:,.1f}-{step['max'] * 1e3:,.1f} ms (spread {step['spread']:.0%})")
        seen = probes["spread"].get("measured_step")
        if seen:
            text += f"; steps measured {seen['min'] * 1e3:,.1f}-{seen['max'] * 1e3:,.1f} ms"
        text += f". Probing cost {probes['cost_fraction']:.1%} of the steps' time."
    return text


def render(rows: list[Twin], console, probes: dict | None = None) -> None:
    """The rich table, captioned with `caption(probes)` (`probes`: `probe_summary`'s, optional)."""
    from rich.table import Table
    table = Table(title="ringzero.plan's prediction beside the measurement (busiest rank)",
                  caption=caption(probes), caption_justify="left")
    for col, just in (("quantity", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right")):
        table.add_column(col, justify=just)
    for t in rows:
        err = "" if t.error is None else f"{t.error * 100:+.1f} %"
        seen = "not metered" if t.measured is None else _fmt(t.measured, t.unit)
        table.add_row(t.name, _fmt(t.predicted, t.unit), seen, err)
    console.print(table)


def _fmt(x: float, unit: str) -> str:
    if unit == "bytes":
        return f"{x / 2**20:,.3f} MiB"
    if unit == "s":
        return f"{x * 1e3:,.1f} ms"
    if unit == "fraction":
        return f"{x:.1%}"
    return f"{x:,.0f} {unit}"
