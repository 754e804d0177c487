"""What to change in a run, ranked by the planner's predicted gain for this model and world.

From a run's JSON report (its configuration, the probed rates and the busiest rank's bucket
layout), each candidate change (`candidates`: more micro-batches under a pipeline, another ZeRO
stage, another all-reduce algorithm, hierarchical all-reduce over nodes, gradient compression,
less recomputation) is priced by the same step model the twin table's prediction uses
(`twin.step.step_seconds` at the run's probed compute rates) and ranked by predicted tokens per
second over the run's own figure priced the same way; memory is the model states and one
micro-batch's activations (`twin.predict.states`, `activations`). Every variant's collectives are
priced by the calibrated α-β-γ model plus the emulated link's time for its cross-node bytes
(`twin.links.emulated_link_seconds`), the run's included, never by the probe's timed calls: the
probe timed only the run's own calls, and pricing the run by them and a variant by the model would
rank the two sources rather than the two configurations. The changes keep the run's bucket layout: a change that
would lay the buckets out anew is offered only where the planner lays them out as the engine does
(`layout`: another bucket size under plain DP and ZeRO-1/2 without tensor or pipeline parallelism),
not ZeRO-3's root bucket.

`ringzero analyze REPORT.json --try-best` reruns the top one and prints the measured gain beside
the predicted one.
"""

from __future__ import annotations

import math

from ringzero.plan.strategies.compression_plan import pack, rank_shapes
from ringzero.run.config import TrainConfig
from ringzero.twin import predict
from ringzero.twin.links import emulated_link_seconds
from ringzero.twin.step import step_seconds

FLAGS = {"grad_accum": "--grad-accum", "strategy": "--strategy", "comm_algorithm": "--comm-algorithm",
         "compress": "--compress", "compress_start": "--compress-start", "recompute": "--recompute",
         "schedule": "--schedule", "bucket_mb": "--bucket-mb"}
"""The command-line flag of each field a suggestion changes."""


def candidates(cfg: TrainConfig, world: int) -> list[tuple[str, dict]]:
    """(why, the fields it changes) for every change worth pricing on this run."""
    p, out = cfg.parallel, []
    dp = cfg.placement(world).dp
    if p.pp > 1:
        for m in (2 * cfg.training.grad_accum, 4 * cfg.training.grad_accum):
            out.append((f"more micro-batches (m = {m}) shrink the pipeline bubble", {"grad_accum": m}))
        if p.schedule == "gpipe":
            out.append(("1F1B holds fewer micro-batches' activations at once", {"schedule": "1f1b"}))
    if dp > 1:
        for s in ("dp", "zero1", "zero2"):
            if s != p.strategy and p.strategy != "zero3":
                out.append((f"ZeRO stage: {s}", {"strategy": s}))
        if p.strategy != "zero3" and p.tp == 1 and p.pp == 1 and cfg.compress.compress == "none":
            out.append((f"larger gradient buckets ({4 * p.bucket_mb:g} MiB): fewer, longer reductions",
                        {"bucket_mb": 4 * p.bucket_mb}))
        algos = ["ring", "tree", "rabenseifner"] + (["hierarchical"] if p.ranks_per_node else [])
        for a in algos:
            if a != p.comm_algorithm:
                why = "hierarchical all-reduce: one rank per node crosses the link" if a == "hierarchical" else f"all-reduce algorithm: {a}"
                out.append((why, {"comm_algorithm": a}))
        if cfg.compress.compress == "none" and p.strategy == "dp":
            for c in ("bf16", "powersgd"):
                out.append((f"gradient compression: {c}", {"compress": c, "compress_start": 0}))
    if cfg.training.recompute != "none":
        out.append(("no recomputation: backward does not redo forward", {"recompute": "none"}))
    return out


def layout(cfg: TrainConfig) -> list[tuple[int, bool, list[tuple[int, ...]]]]:
    """The flat buckets of one rank without tensor or pipeline parallelism, as the engine lays them
    out (`plan.strategies.compression_plan.pack`: reverse registration order, a new bucket past
    `bucket_mb`): (elements, is ZeRO-3's root, the tensors' shapes as the planner has them: q, k
    and v apart where the engine fuses them, so a layout for gradient compression, which needs the
    engine's matrices, is not made here)."""
    shapes = pack(rank_shapes(cfg.shape), cfg.value_bytes, cfg.parallel.bucket_mb)
    return [(sum(math.prod(s) for s in b), False, list(b)) for b in shapes]


def ranked(report: dict, top: int = 5) -> list[dict]:
    """The candidates that this run's configuration takes, best predicted gain first: {"why",
    "changes", "flags", "step_s", "tokens_per_s", "gain", "memory_bytes"}; "base" first of all, the
    run itself as predicted."""
    cfg, world = TrainConfig.from_dict(report["config"]), report["world"]
    rates = {k: v for k, v in report["probe"].items() if k != "comm"}
    busiest = max(report["ranks"], key=lambda r: r["step_time"])
    buckets = [tuple(b) if not isinstance(b[-1], list) else (b[0], b[1], [tuple(s) for s in b[2]])
               for b in busiest["buckets"]]
    sp, rank = busiest.get("sp_elements"), busiest["rank"]

    def price(c: TrainConfig) -> dict:
        step = step_seconds(c, world, buckets, rates, sp, rank)["step"] + emulated_link_seconds(c, world, buckets, rank, sp)
        memory = sum(predict.states(c, world, busiest["rank"]).values()) + predict.activations(c)
        return {"step_s": step, "tokens_per_s": c.global_batch(world) * c.shape.seq / step, "memory_bytes": memory}

    base = {"why": "this run", "changes": {}, "flags": [], **price(cfg), "gain": 1.0}
    out = []
    for why, changes in candidates(cfg, world):
        try:
            other = TrainConfig.from_dict(report["config"], **changes)
            priced = price(other)
        except (ValueError, KeyError):        # a change this run's other settings refuse, or cannot price
            continue
        flags = [x for k, v in changes.items() for x in (FLAGS[k], str(v))]
        out.append({"why": why, "changes": changes, "flags": flags, **priced,
                    "gain": priced["tokens_per_s"] / base["tokens_per_s"]})
    return [base] + sorted(out, key=lambda s: -s["gain"])[:top]
