"""Search every way to split one training run over a GPU budget, keep what fits, rank by step time.

`plan.search.recommend` picks a layout by a decision flow; the search answers the same question
exhaustively, over the dp x tp x pp grid of Narayanan et al. 2021 §3 (TP inside a node on NVLink,
PP across nodes, DP outermost: the placement `strategy_comm` prices). For `gpus` GPUs it tries every

    tp  dividing the heads and the kv heads, tp <= max_tp (default: gpus_per_node, so every
        tensor-parallel all-reduce stays on NVLink),
    pp  dividing the layers (balanced stages),
    dp  = gpus / (tp·pp),

and for each split every ZeRO stage x offload x recomputation x sequence parallelism x pipeline
schedule x micro-batch of the `Space`. Combinations that cannot run are skipped silently and not
counted as evaluated: sequence parallelism with tp = 1, offload with ZeRO-0, a micro-batch x dp that
does not divide the global batch, the interleaved schedule (with `Space.virtual_stages` chunks per
rank) when pp·v does not divide the layers or pp does not divide the micro-batches, a pipeline of
more micro-batches than `limits.MAX_MICRO_BATCHES` (its schedule is played through each), and any
`Parallel` the caller's `keep` rejects; with pp = 1 only the first schedule other than interleaved
is tried (they coincide).

Global batch: configurations are only comparable at the same tokens per step, so all of them run
`global_batch` sequences per step: `training.global_batch` when set, otherwise
gpus x min(micro_batches), the smallest batch at which every split (dp always divides gpus) can run
the smallest micro-batch, i.e. one micro-batch per GPU for pure data parallelism (4M tokens for
llama-2-70b on 1,024 GPUs, Llama 2's own batch). `training.micro_batch` is ignored; the rest of
`training` (precision, optimizer, dropout, tokens) is kept.

Evaluation is memory first and time only for what fits, with the same `memory`, `comm_ops` and
`step_time` that `estimate` calls (`_evaluate`; their caches make repeats cheap); the top k are
rebuilt as full `estimate(...)` results, so their numbers are those of the single-plan report.
`SearchResult.why` explains the winner against the runner-up, against its own configuration with
one memory saving undone, and against plain data parallelism.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ringzero.plan.search import layout_check
from ringzero.plan.search import limits
from ringzero.plan.config import Parallel, Training
from ringzero.plan.pipeline.schedule import effective_virtual_stages
from ringzero.plan.estimate import estimate
from ringzero.plan.hardware import Hardware
from ringzero.plan.strategies.memory import Memory, memory
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.step_time import StepTime, comm_ops, step_time
from ringzero.plan.search.result import SearchResult, Space
from ringzero.plan.search.why import label  # noqa: F401  (label: part of this module's API)


def _splits(m: ModelShape, gpus: int, max_tp: int) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) with dp·tp·pp = gpus, tp | heads, tp | kv heads, tp <= max_tp, pp | layers,
    tp and pp ascending. Only tp <= min(max_tp, heads) and the divisors of the layers are tried, so
    the split takes O(max_tp + layers) steps whatever the GPU count."""
    out = []
    for tp in range(1, min(max_tp, m.heads, gpus) + 1):
        if gpus % tp or m.heads % tp or m.kv % tp:
            continue
        for pp in range(1, m.layers + 1):
            if m.layers % pp == 0 and (gpus // tp) % pp == 0:
                out.append((gpus // (tp * pp), tp, pp))
    return out


def _schedules(m: ModelShape, pp: int, space: Space) -> list[tuple[str, int]]:
    """(schedule, virtual stages) tried on `pp` stages: one without a pipeline; interleaved only
    when its pp·v chunks split the layers evenly."""
    if pp == 1:
        return [(next((s for s in space.schedules if s != "interleaved"), "1f1b"), 1)]
    v = space.virtual_stages
    return [(s, effective_virtual_stages(s, v)) for s in space.schedules
            if s != "interleaved" or m.layers % (pp * v) == 0]


def _configurations(m: ModelShape, tr: Training, hw: Hardware, gpus: int, space: Space,
                    keep: Callable[[Parallel], bool] | None = None):
    """Every (Training, Parallel) the search evaluates, simplest split first (see the module doc).
    The micro-batch is the innermost loop: it lives in `Training`, so each `Parallel` is built once."""
    trainings = [(mb, dataclasses.replace(tr, micro_batch=mb)) for mb in space.micro_batches]
    for dp, tp, pp in _splits(m, gpus, space.max_tp or hw.gpus_per_node):
        runs = [t for mb, t in trainings if t.global_batch % (mb * dp) == 0]
        if not runs:
            continue
        sps = space.sequence_parallel if tp > 1 else (False,)
        for zero in space.zero:
            for offload in space.offload if zero else ("none",) if "none" in space.offload else ():
                for recompute in space.recompute:
                    for sp in sps:
                        for schedule, v in _schedules(m, pp, space):
                            par = Parallel(dp=dp, tp=tp, pp=pp, zero=zero, offload=offload, sequence_parallel=sp,
                                           schedule=schedule, virtual_stages=v, recompute=recompute)
                            if layout_check.problem(m, par) or (keep is not None and not keep(par)):
                                continue
                            for t in runs:
                                micro = t.accumulation(dp)
                                # the interleaved schedule runs micro-batches in groups of pp
                                if (schedule != "interleaved" or micro % pp == 0) and \
                                        (pp == 1 or micro <= limits.MAX_MICRO_BATCHES):
                                    yield t, par


def _evaluate(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> tuple[Memory, StepTime | None]:
    """The fast path: `estimate`'s memory, and its step time only when the memory fits."""
    mem = memory(m, tr, par)
    if mem.total > hw.hbm_bytes:
        return mem, None
    return mem, step_time(m, tr, par, hw, comm_ops(m, tr, par, hw))


TIE_RTOL = 1e-9
"""Step times this close (relative) are a tie. The time model ignores some choices (sequence
parallelism moves the same bytes as its all-reduce), and the same time summed in another order
differs in its last bits (1.5151704747574055 against ...57 s on llama-2-7b, 64 GPUs): a tie
either way, which exact comparison would break by rounding instead of by memory."""


def rank(ranked: list[tuple], hbm_bytes: int) -> list[tuple]:
    """`ranked` rows (step seconds, memory bytes, evaluation order, ...) fastest first; among rows
    whose step time ties (within `TIE_RTOL` of the first row of the tie) the most memory headroom
    (hbm_bytes - memory) first, then the earlier evaluated (the simpler split). Deterministic: the
    order depends only on the rows."""
    rows = sorted(ranked, key=lambda r: r[:3])
    out, i = [], 0
    while i < len(rows):
        j, limit = i + 1, rows[i][0] * (1 + TIE_RTOL)
        while j < len(rows) and rows[j][0] <= limit:
            j += 1
        out += sorted(rows[i:j], key=lambda r: (-(hbm_bytes - r[1]), r[2])) if j - i > 1 else rows[i:j]
        i = j
    return out


def search(model: ModelShape, training: Training, hardware: Hardware, gpus: int, *,
           space: Space = Space(), top: int = 10, keep: Callable[[Parallel], bool] | None = None) -> SearchResult:
    """The `top` fastest configurations of `model` on `gpus` GPUs of `hardware` that fit in memory
    (only those whose `Parallel` `keep` accepts, when given: e.g. what an engine can run)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    limits.check(model.layers, gpus)
    start = time.perf_counter()
    batch = training.global_batch or gpus * min(space.micro_batches)
    tr = dataclasses.replace(training, global_batch=batch)
    ranked: list[tuple[float, float, int, Training, Parallel]] = []
    evaluated, leanest = 0, None
    for t, par in _configurations(model, tr, hardware, gpus, space, keep):
        mem, time_ = _evaluate(model, t, par, hardware)
        evaluated += 1
        if time_ is not None:
            ranked.append((time_.step, mem.total, evaluated, t, par))
        elif leanest is None or mem.total < leanest[0]:
            leanest = (mem.total, t, par)
    ranked = rank(ranked, hardware.hbm_bytes)
    best = [estimate(model, t, par, hardware) for *_, t, par in ranked[:top]]
    closest = estimate(model, leanest[1], leanest[2], hardware) if not ranked and leanest else None
    return SearchResult(best=best, evaluated=evaluated, fitting=len(ranked), seconds=time.perf_counter() - start,
                        gpus=gpus, global_batch=batch, space=space, closest=closest)
