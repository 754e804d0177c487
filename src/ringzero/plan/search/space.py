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
from dataclasses import dataclass

from ringzero.plan.search import layout_check
from ringzero.plan.search import limits
from ringzero.plan.config import OFFLOADS, RECOMPUTES, SCHEDULES, Parallel, Training
from ringzero.plan.estimate import Estimate, estimate
from ringzero.plan.hardware import Hardware
from ringzero.plan.strategies.memory import Memory, memory
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.step_time import StepTime, comm_ops, step_time
from ringzero.plan.search.why import explain, label  # noqa: F401  (label: part of this module's API)


def _tuple(name: str, values, allowed, kind) -> tuple:
    """`values` as a tuple without duplicates, each of type `kind` and in `allowed` (if given)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"space {name} must be a tuple, got {values!r}")
    values = tuple(values)
    if not values:
        raise ValueError(f"space {name} must not be empty")
    for v in values:
        if type(v) is not kind:
            raise ValueError(f"space {name} values must be {kind.__name__}, got {v!r}")
        if allowed is not None and v not in allowed:
            raise ValueError(f"space {name}={v!r} is not supported; allowed: {', '.join(map(str, allowed))}")
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class Space:
    """What the search enumerates for each dp x tp x pp split (lists are accepted and deduplicated)."""

    zero: tuple[int, ...] = (0, 1, 2, 3)
    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    recompute: tuple[str, ...] = RECOMPUTES
    sequence_parallel: tuple[bool, ...] = (False, True)
    """Only tried when tp > 1 (tp = 1 runs without)."""
    offload: tuple[str, ...] = ("none",)
    """"cpu"/"nvme" are tried only with ZeRO >= 1."""
    schedules: tuple[str, ...] = ("1f1b",)
    virtual_stages: int = 2
    """Model chunks per rank the "interleaved" schedule is tried with."""
    max_tp: int | None = None
    """Largest tensor-parallel degree (None: the hardware's gpus_per_node)."""

    def __post_init__(self) -> None:
        checks = {"zero": ((0, 1, 2, 3), int), "micro_batches": (None, int), "recompute": (RECOMPUTES, str),
                  "sequence_parallel": ((False, True), bool), "offload": (OFFLOADS, str),
                  "schedules": (SCHEDULES, str)}
        for name, (allowed, kind) in checks.items():
            object.__setattr__(self, name, _tuple(name, getattr(self, name), allowed, kind))
        if min(self.micro_batches) < 1:
            raise ValueError(f"space micro_batches must be >= 1, got {min(self.micro_batches)}")
        if type(self.virtual_stages) is not int or self.virtual_stages < 1:
            raise ValueError(f"space virtual_stages must be an int >= 1, got {self.virtual_stages!r}")
        if self.max_tp is not None and (type(self.max_tp) is not int or self.max_tp < 1):
            raise ValueError(f"space max_tp must be None or an int >= 1, got {self.max_tp!r}")


@dataclass(frozen=True)
class SearchResult:
    """The ranked configurations of one search, and what it cost."""

    best: list[Estimate]
    """Top-k fitting configurations, fastest step first (ties, within `TIE_RTOL`: the one with more
    memory headroom per GPU, then the earlier, simpler split; `rank`)."""
    evaluated: int
    """Configurations evaluated (memory and, when it fits, time)."""
    fitting: int
    seconds: float
    """Wall time of the search."""
    gpus: int = 0
    global_batch: int = 0
    """Sequences per step of every configuration: training.global_batch when set, otherwise
    gpus x min(space.micro_batches) (see the module doc)."""
    space: Space | None = None
    """What was enumerated (`neighbours` stays inside it)."""
    closest: Estimate | None = None
    """When nothing fits: the configuration that needs the least memory."""

    @property
    def rate(self) -> float:
        """Configurations evaluated per second."""
        return self.evaluated / self.seconds if self.seconds > 0 else 0.0

    def baseline(self) -> Estimate | None:
        """The simplest alternative to best[0]: plain data parallelism (dp = gpus, ZeRO-0, no
        recomputation, the smallest micro-batch), None when nothing fits or it cannot run."""
        if not self.best:
            return None
        b = self.best[0]
        mb = min(self.space.micro_batches) if self.space else 1
        return _try(b.model, dataclasses.replace(b.training, micro_batch=mb), Parallel(dp=b.parallel.gpus),
                    b.hardware)

    def neighbours(self) -> list[Estimate]:
        """best[0] with one memory saving undone, each to the next lighter value in the space: a lower
        ZeRO stage, lighter recomputation, less offload, no sequence parallelism."""
        if not self.best:
            return []
        b, space = self.best[0], self.space or Space()
        p, out = b.parallel, []
        lighter = {"zero": sorted(z for z in space.zero if z < p.zero),
                   "recompute": [r for r in RECOMPUTES[:RECOMPUTES.index(p.recompute)] if r in space.recompute],
                   "offload": [o for o in OFFLOADS[:OFFLOADS.index(p.offload)] if o in space.offload],
                   "sequence_parallel": [False] if p.sequence_parallel and False in space.sequence_parallel else []}
        for field, values in lighter.items():
            if values:                                 # the nearest lighter value: the last one
                change = {field: values[-1]} | ({"offload": "none"} if field == "zero" and values[-1] == 0 else {})
                e = _try(b.model, b.training, dataclasses.replace(p, **change), b.hardware)
                out += [e] if e is not None else []
        return out

    def why(self) -> list[str]:
        """Short sentences, numbers from the estimates: why best[0] wins over the runner-up, over
        its lighter neighbours (or why it needs what they lack) and over plain data parallelism
        (`plan.search.why`)."""
        return explain(self)


def _try(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> Estimate | None:
    try:
        return estimate(m, tr, par, hw)
    except ValueError:      # e.g. the global batch does not divide by micro-batch x dp
        return None


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
    return [(s, v if s == "interleaved" else 1) for s in space.schedules
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
