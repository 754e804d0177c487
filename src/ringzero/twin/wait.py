"""Waiting for peers, per rank, in an all-reduce or ZeRO run: the twin and the table of ranks.

A synchronous step ends together on every rank, so a rank that computes less waits inside the
step's collectives for the slowest (the straggler problem; Ho et al. 2013 §1): predicted
(`plan.strategies.param_server.wait_seconds`, the same synchronous barrier), it waits max_j c_j − c_i per
step, c its compute (forward, backward and an injected straggler's sleep).
Measured by the flight recorder (`comm.timeline.waits`): in each collective, the time from this
rank's arrival to the last member's, timed apart from the bytes moving after it, counted where the
rank's computation was blocked (a bucket's all-reduce that waits while backward still runs costs
nothing). Medians over the steady steps.

Under tensor parallelism and ZeRO-3 most of that wait falls inside forward and backward (the
layers' collectives), so the table of ranks shows apart the part of it inside the exposed
communication, which is the twin table's "exposed communication per step" (waiting included).
"""

from __future__ import annotations

import dataclasses
import statistics

from ringzero.comm.timeline import Timeline
from ringzero.comm.timeline import waits as arrival_waits
from ringzero.plan.strategies.param_server import wait_seconds
from ringzero.run.config import TrainConfig
from ringzero.run.result import RankResult
from ringzero.twin.twin import Twin


def compute(r: RankResult) -> float:
    return r.phases["forward"] + r.phases["backward"] + r.phases.get("straggler", 0.0)


def _medians(results: list[RankResult], log=lambda t: t) -> list[float]:
    """Each rank's median over the steady steps of its wait (`timeline.waits` of `log(timeline)`)."""
    steps = min(len(r.calls) for r in results)
    per_step = [arrival_waits([log(r.calls[k]) for r in results]) for k in range(steps)]
    return [statistics.median(w[i] for w in per_step) if per_step else 0.0 for i in range(len(results))]


def _in_comm(t: Timeline) -> Timeline:
    """`t` with every call counted as made beside computation, so that a wait counts only inside
    the spans the computing thread blocked for communication: the step's comm phase."""
    out = Timeline()
    out.calls, out.blocked = [dataclasses.replace(c, beside=True) for c in t.calls], list(t.blocked)
    return out


def waits(results: list[RankResult]) -> tuple[list[float], list[float]]:
    """(predicted, measured) seconds each rank waits for the others per step."""
    return wait_seconds([compute(r) for r in results]), _medians(results)


def comm_waits(results: list[RankResult]) -> list[float]:
    """Seconds each rank waits for the others per step inside its exposed communication."""
    return _medians(results, _in_comm)


def kind_waits(results: list[RankResult]) -> list[dict[str, float]]:
    """Each rank's median wait per step in each communication kind's collectives (`comm.kinds`),
    the kinds it waited in at all."""
    kinds = sorted({c.kind for r in results for t in r.calls for c in t.calls})
    per = {k: _medians(results, lambda t, k=k: _only(t, k)) for k in kinds}
    return [{k: per[k][i] for k in kinds if per[k][i] > 0} for i in range(len(results))]


def into_json(ranks_json: list[dict], rows: list[dict], results: list[RankResult]) -> None:
    """Each rank's row of the table of ranks (`render`'s) and its waits by kind (`kind_waits`) into
    the JSON report's entry of that rank."""
    by_rank = {row["rank"]: row for row in rows}
    for d, w in zip(ranks_json, kind_waits(results)):
        d.update(by_rank.get(d["rank"], {}), waits_by_kind=w)


def _only(t: Timeline, kind: str) -> Timeline:
    out = Timeline()
    out.calls, out.blocked = [c for c in t.calls if c.kind == kind], list(t.blocked)
    return out


def twins(cfg: TrainConfig, world: int, results: list[RankResult]) -> list[Twin]:
    """The most waiting rank's wait, when a straggler is injected (otherwise the waits are noise).
    None under ZeRO-3, tensor or pipeline parallelism: there the wait falls inside forward and
    backward (the weights' all-gathers, the tp collectives) or into the bubble, not into the
    exposed communication this measures."""
    if cfg.faults.straggler is None or world == 1 or cfg.parallel.pp > 1 or cfg.parallel.tp > 1 or cfg.sharding.shard_params:
        return []
    predicted, measured = waits(results)
    i = max(range(len(results)), key=lambda k: predicted[k])
    return [Twin(f"waiting for the straggler (rank {results[i].rank}, per step)", predicted[i], measured[i], "s")]


def render(cfg: TrainConfig, results: list[RankResult], console) -> list[dict]:
    """Per rank: compute, waiting (its prediction), exposed communication as the twin table's and
    the waiting inside it; printed, and returned as data."""
    from rich.table import Table
    if len(results) == 1 or cfg.parallel.pp > 1:
        return []
    predicted, measured = waits(results)
    rows = [{"rank": r.rank, "compute_s": compute(r), "waiting_s": m, "predicted_waiting_s": p,
             "comm_s": r.phases["comm"], "comm_waiting_s": w}
            for r, p, m, w in zip(results, predicted, measured, comm_waits(results))]
    table = Table(title="every rank per step (medians of steady steps): waiting = in collectives, from "
                        "this rank's arrival to the last peer's, wherever it falls (under tensor parallelism "
                        "and ZeRO-3 mostly inside forward and backward); exposed communication = the twin "
                        "table's (the step outside forward, backward and the optimizer), waiting in it included")
    for col in ("rank", "compute", "waiting (predicted)", "exposed communication", "waiting in it"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["rank"]), f"{r['compute_s'] * 1e3:.1f} ms",
                      f"{r['waiting_s'] * 1e3:.1f} ms ({r['predicted_waiting_s'] * 1e3:.1f})",
                      f"{r['comm_s'] * 1e3:.1f} ms", f"{r['comm_waiting_s'] * 1e3:.1f} ms")
    console.print(table)
    return rows
