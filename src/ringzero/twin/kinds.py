"""The report's byte twins by communication kind: what `predict.traffic_by_kind` says each rank
sends per step of every kind beside what the traffic meter counted of that kind in the measured
step (`RankResult.kinds`, each collective and point-to-point post tagged where the engine calls
it: `ringzero.comm.kinds`). Each is exact: the kinds split the step's bytes, they do not estimate
them, so a tp × pp × dp run shows its tensor-parallel bytes apart from its data-parallel ones."""

from __future__ import annotations

from ringzero.plan.comm.kinds import TABLE
from ringzero.plan.comm.volume import Volume
from ringzero.run.config import TrainConfig
from ringzero.twin import predict
from ringzero.twin.twin import Twin

LABELS = {k.name: k.label for k in TABLE.values() if k.predicted}
"""The kinds a training step's traffic is predicted in, in the table's order, as its rows name them
(`plan.comm.kinds.TABLE`)."""


def row_name(kind: str) -> str:
    return f"bytes sent per step: {TABLE[kind].label if kind in TABLE else kind}"


def twins(cfg: TrainConfig, world: int, results: list) -> list[Twin]:
    """One row per kind that moves bytes on any rank (predicted or measured), the busiest rank's of
    each; none when there is one kind only (the total's row says it) or the backend's own
    collectives run (the meter cannot see inside them)."""
    if world == 1 or cfg.parallel.comm_algorithm == "torch":
        return []
    want = [predict.traffic_by_kind(cfg, world, r.buckets, r.rank, r.sp_elements) for r in results]
    got = [{k: Volume(**v) for k, v in r.kinds.items()} for r in results]
    kinds = {k for w in want for k, v in w.items() if v.bytes_sent} | {k for g in got for k, v in g.items() if v.bytes_sent}
    if len(kinds) < 2:
        return []
    order = sorted(kinds, key=lambda k: (list(LABELS).index(k) if k in LABELS else len(LABELS), k))
    return [Twin(row_name(k), max(w.get(k, Volume()).bytes_sent for w in want),
                 max(g.get(k, Volume()).bytes_sent for g in got), "bytes") for k in order]
