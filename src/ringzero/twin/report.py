"""Predicted beside measured: the table (and JSON) that closes every training run.

Each row is a twin: a quantity `ringzero.plan` predicts for this exact configuration and the same
quantity measured on the ranks, with the relative error (measured - predicted) / predicted, + when
the measurement is above the prediction (`ERROR_DEFINITION`, printed under the table and written in
the JSON). Figures are the busiest rank's (the maximum over ranks), per step or per micro-batch
as named. Memory, activations and bytes on the wire are exact formulas of the configuration.

Step time is predicted from the planner's counts and the rates the in-run probes measured
(`twin.step`, which says how each phase is priced). The step's phases are rows of their
own, predicted and measured: what a measured step spent outside every phase is the row "rest of the
step" (predicted 0: the planner has no such term), so that each step's phases and rest add up to
it; the rows show the medians over the steady steps of each (medians do not add, so the measured
rows add up to the step's median only about). With an injected
straggler the rank shown is the straggler (the busiest by construction: every rank's synchronous
step lasts as long as its), whose extra compute is its own row.
"""

from __future__ import annotations

import math
import os
import statistics

from ringzero.twin import compression as report_compression
from ringzero.twin import kinds as report_kinds
from ringzero.twin import predict
from ringzero.twin import zero as report_zero
from ringzero.twin import pipeline as pipe
from ringzero.run.config import TrainConfig
from ringzero.run.result import RankResult
from ringzero.twin.step import comm_seconds, step_seconds, unpriced
from ringzero.twin.rates import pooled_flops, unsteady
from ringzero.twin.simulated import simulated_step
from ringzero.twin.twin import Twin
from ringzero.twin import wait as report_wait

SCHEMA = "ringzero.train-report/2"
"""The JSON report's schema (`to_json`; a parameter-server run's has the same header, `header`)."""

ERROR_DEFINITION = (
    "error = (measured - predicted) / predicted: + means the measurement is above the prediction "
    "(slower or larger; for tokens per second, faster), - below. Exposed communication is the time "
    "of a step not spent in forward, backward or the optimizer: communication that compute did not "
    "hide (the last gradient buckets, ZeRO-1/2's all-gather after the update, the gradient norm's "
    "all-reduce, and waiting for slower ranks). ZeRO-3's all-gathers of a layer's weights run inside "
    "forward and backward: predicted and measured as compute.")


def _busiest(results: list[RankResult], cfg: TrainConfig | None = None) -> RankResult:
    """The rank the table shows: the injected straggler (`cfg.faults.straggler`), else the slowest step's."""
    if cfg is not None and cfg.faults.straggler is not None:
        return next((r for r in results if r.rank == cfg.faults.straggler[0]), max(results, key=lambda r: r.step_time))
    return max(results, key=lambda r: r.step_time)


def _pooled(results: list[RankResult]) -> bool:
    n = len(results[0].probes)
    return n > 0 and all(len(r.probes) == n for r in results)


def run_rates(results: list[RankResult], cfg: TrainConfig | None = None) -> dict:
    """The busiest rank's probed rates, but the block's FLOP/s over every rank's points
    (`rates.pooled_flops`: ranks that share cores take turns at a core of their own)."""
    own = _busiest(results, cfg).probe
    return {**own, "flops": pooled_flops([r.probes for r in results])} if _pooled(results) else own


def _stats(xs: list[float]) -> dict[str, float]:
    mid = statistics.median(xs)
    return {"min": min(xs), "median": mid, "max": max(xs), "spread": (max(xs) - min(xs)) / mid if mid else 0.0}


def probe_summary(cfg: TrainConfig, world: int, results: list[RankResult]) -> dict:
    """The busiest rank's (the table's) probe points with the prediction each one alone gives, the
    spread ((max - min) / median) of the rates, of those predictions and of the measured steps
    ("measured_step"), and what probing cost against the steps' time."""
    res, pooled = _busiest(results, cfg), _pooled(results)
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
            "cost_fraction": cost / (cfg.training.steps * res.step_time) if res.step_time else 0.0}


def twins(cfg: TrainConfig, world: int, results: list[RankResult]) -> list[Twin]:
    busiest = _busiest(results, cfg)
    states = [predict.states(cfg, world, r.rank) for r in results]
    sent = [predict.traffic(cfg, world, r.buckets, r.rank, r.sp_elements) for r in results]
    total_sent = [sum(op["bytes_sent"] for op in r.traffic.get("ops", {}).values()) for r in results]
    total_recv = [sum(op["bytes_recv"] for op in r.traffic.get("ops", {}).values()) for r in results]
    steps = step_seconds(cfg, world, busiest.buckets, run_rates(results, cfg), busiest.sp_elements, busiest.rank)
    tokens = cfg.global_batch(world) * cfg.shape.seq
    rows = [Twin(f"{name} held", max(s[key] for s in states), max(r.held[key] for r in results), "bytes")
            for name, key in (("parameters", "params"), ("gradients", "grads"), ("optimizer states", "optimizer"))]
    if cfg.parallel.pp == 1:
        rows.append(Twin("activations saved (one micro-batch)", predict.activations(cfg),
                         max(r.activations for r in results), "bytes"))
    if world > 1:
        opaque = cfg.parallel.comm_algorithm == "torch"      # predicted as the backend's ring, not metered
        rows += [Twin("bytes sent per step", max(s["bytes_sent"] for s in sent),
                      None if opaque else max(total_sent), "bytes"),
                 Twin("bytes received per step", max(s["bytes_recv"] for s in sent),
                      None if opaque else max(total_recv), "bytes")]
    rows += report_kinds.twins(cfg, world, results)
    rows += report_zero.link_twins(cfg, world, results) + report_zero.zeropp_twins(cfg, world, results) \
        + report_zero.gathered_twins(cfg, world, results) \
        + report_zero.offload_twins(cfg, world, results) \
        + report_compression.twins(cfg, world, results, run_rates(results, cfg))
    if cfg.parallel.pp > 1:
        rows += pipeline_twins(cfg, world, results)
    rows += report_wait.twins(cfg, world, results)
    rows += phase_twins(cfg, busiest, steps)
    simulated = simulated_step(cfg, world, run_rates(results, cfg), busiest.buckets)
    rows += [
        Twin("step time", steps["step"], busiest.step_time, "s"),
        *([Twin("step time, simulated (the step's events played)", simulated, busiest.step_time, "s")]
          if simulated is not None else []),
        Twin("tokens per second", tokens / steps["step"], tokens / busiest.step_time, "tokens/s"),
    ]
    return [r for r in rows if world > 1 or "communication" not in r.name]


REST = "rest of the step (outside the phases above)"


def phase_twins(cfg: TrainConfig, r: RankResult, steps: dict[str, float]) -> list[Twin]:
    """Rank `r`'s step, phase by phase (`predict_step.step_seconds`' `steps` beside its medians),
    each in one row only: the predicted rows add up to the predicted step; the measured ones, with
    `REST` (the median of each step's time outside every phase, `RankResult.rest`), to each
    measured step, their medians to about the median step."""
    ph = r.phases
    rows = [Twin("compute per step", steps["compute"], ph["forward"] + ph["backward"], "s")]
    if cfg.faults.straggler is not None:
        rows.append(Twin(f"straggler's extra compute per step (rank {cfg.faults.straggler[0]}; every rank's step "
                         f"waits for it)", steps["straggler"], ph.get("straggler", 0.0), "s"))
    rows += [Twin("exposed communication per step", steps["comm"], ph["comm"], "s"),
             Twin("optimizer per step", steps["optimizer"], ph["optimizer"], "s")]
    if cfg.parallel.pp > 1:
        rows.append(Twin("pipeline wait per step", steps["bubble"], ph["pipeline_wait"], "s"))
    return rows + [Twin(REST, 0.0, r.rest, "s")]


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
    boundaries = cfg.parallel.pp * cfg.parallel.virtual_stages - 1
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


def header(cfg: TrainConfig, world: int, results: list[RankResult]) -> dict:
    """What every JSON report (`to_json`, and a parameter-server run's) opens with: "schema",
    "config", "world", "losses" (the mean loss of each step this run ran, in order), "first_step"
    (the number of steps before the first of them: 0, or a resumed run's checkpoint step, so
    losses[i] is step first_step + i + 1's) and "val" ([{"step", "loss"}], steps counted from 1)."""
    r0 = results[0]
    return {"schema": SCHEMA, "config": cfg.as_dict(), "world": world,
            "first_step": cfg.training.steps - len(r0.losses), "losses": r0.losses,
            "val": [{"step": s, "loss": v} for s, v in r0.val]}


def validation_line(cfg: TrainConfig, val: list[tuple[int, float]]) -> str:
    """The validation losses beside a uniform guess's: over the model's vocabulary (an untrained
    model's loss), and over the 256 byte values the data hold (`train.data` is byte-level) when
    the vocabulary is larger."""
    v = cfg.shape.vocab
    text = f"uniform over the model's vocabulary of {v:,}: ln {v:,} = {math.log(v):.3f}"
    if v > 256:
        text += f"; over the data's 256 byte values: ln 256 = {math.log(256):.3f}"
    return "validation loss: " + ", ".join(f"step {s}: {x:.3f}" for s, x in val) + f"   ({text})"


def to_json(cfg: TrainConfig, world: int, results: list[RankResult], rows: list[Twin],
            probes: dict | None = None) -> dict:
    """The report as plain data (`probes`: `probe_summary`'s, when the caller has it already);
    `header`'s keys first."""
    r0, busiest, probed = results[0], _busiest(results, cfg), run_rates(results, cfg)
    probes = probes or probe_summary(cfg, world, results)
    return {**header(cfg, world, results), "error_definition": ERROR_DEFINITION,
            "twins": {t.name: t.to_json() for t in rows}, "skipped_steps": r0.skipped,
            "predicted_phases": step_seconds(cfg, world, busiest.buckets, probed, busiest.sp_elements, busiest.rank),
            "probe": probed, "probes": probes,
            "unpriced": unpriced(cfg, world, os.cpu_count() or 1), "not_held": unsteady(probes),
            "communication_model": comm_seconds(cfg, world, busiest.buckets, probed, busiest.sp_elements,
                                                busiest.rank)["source"],
            "alpha_beta_gamma_comm_s": predict.comm_seconds(cfg, world, busiest.buckets, busiest.sp_elements,
                                                            busiest.rank),
            "pipeline": _pipeline_json(cfg, world, results),
            "ranks": [_rank_json(r) for r in results]}


def _pipeline_json(cfg: TrainConfig, world: int, results: list[RankResult]) -> dict | None:
    """The measured schedule of the last steady step, stage by stage (what `--pipeline-plot` draws)."""
    if cfg.parallel.pp == 1:
        return None
    stages = _stage_ranks(cfg, world, results)
    return {"schedule": cfg.parallel.schedule, "virtual_stages": cfg.parallel.virtual_stages, "micro_batches": cfg.training.grad_accum,
            "idle_fraction": {"predicted": pipe.bubble(cfg),
                              "measured": pipe.measured_bubble([r.timelines for r in stages])},
            "timeline": [[{"kind": k, "micro": mb, "chunk": c, "start": t0, "end": t1}
                          for k, mb, c, t0, t1 in (r.timelines[-1] if r.timelines else [])] for r in stages]}


def _rank_json(r: RankResult) -> dict:
    """What one rank measured (the table shows the busiest; this is every rank)."""
    ops = r.traffic.get("ops", {}).values()
    return {"rank": r.rank, "step_time": r.step_time, "phases": r.phases, "held": r.held,
            "activations": r.activations, "bytes_sent": sum(op["bytes_sent"] for op in ops),
            "bytes_recv": sum(op["bytes_recv"] for op in ops), "skipped_steps": r.skipped,
            "bytes_by_kind": r.kinds, "buckets": r.buckets, "sp_elements": r.sp_elements, "memory": r.memory}


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


def render(rows: list[Twin], console, probes: dict | None = None, rank: int | None = None) -> None:
    """The rich table, captioned with `caption(probes)` (`probes`: `probe_summary`'s, optional);
    `rank`: the rank whose phases it shows."""
    from rich.table import Table
    who = "busiest rank" if rank is None else f"busiest rank: {rank}"
    table = Table(title=f"ringzero.plan's prediction beside the measurement ({who})",
                  caption=caption(probes), caption_justify="left")
    for col, just in (("quantity", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right")):
        table.add_column(col, justify=just)
    for t in rows:
        err = "" if t.error is None else f"{t.error * 100:+.1f} %"
        seen = "not metered" if t.measured is None else _fmt(t.measured, t.unit)
        table.add_row(t.name, _fmt(t.predicted, t.unit), seen, err)
    console.print(table)


def shown_rank(cfg: TrainConfig, results: list[RankResult]) -> int:
    """The rank whose phases and step the table shows (`_busiest`)."""
    return _busiest(results, cfg).rank


def _fmt(x: float, unit: str) -> str:
    if unit == "bytes":
        return f"{x / 2**20:,.3f} MiB"
    if unit == "s":
        return f"{x * 1e3:,.1f} ms"
    if unit == "fraction":
        return f"{x:.1%}"
    if unit == "x":
        return f"{x:,.2f}x"
    return f"{x:,.0f} {unit}"
