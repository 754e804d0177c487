"""The parts of a training loop every kind of rank runs alike (the data-parallel grid's
`engine.Trainer`, a parameter server's worker `ps_engine.PSWorker`): which steps it takes and which
one it measures, one step's forward and backward passes, the clock, traffic meter and collective
timeline around a step, when to validate, and the summary of the steady steps.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from ringzero import comm
from ringzero.comm.timeline import Timeline
from ringzero.plan.comm.volume import FIELDS
from ringzero.run.config import TrainConfig
from ringzero.run.result import RankResult
from ringzero.train.step_schedule import StepHooks

MEASURE_STEP = 1
"""The step whose traffic and saved activations are measured (step 0 warms up; a one-step run
measures step 0)."""


class StepSpan:
    """The steps a run takes, `start` (0, or where a resumed run continues) to `steps`, and
    `measured`, the one whose traffic and saved activations go into the result."""

    def __init__(self, steps: int, first: int = 0) -> None:
        self.steps, self.first = steps, first
        self.set_start(0)

    def set_start(self, step: int) -> None:
        """Begin at `step` (a resumed run): the steps run, and the one whose traffic is measured
        (not before `first`: a compressed run measures a compressed step)."""
        self.start = step
        self.measured = max(step + min(MEASURE_STEP, self.steps - step - 1), min(self.first, self.steps - 1))
        self.plain = self.first - 1 if self.first >= 1 and self.first - 1 >= step else None
        """The last step before compression starts (its traffic: the uncompressed twin), or None."""

    def timed(self, step_fn, step: int, res: RankResult, totals: list[float]):
        """`step_fn(step, res)`, its seconds appended to `totals` and its collectives to `res.calls`;
        the measured step's traffic metered into `res` (and the last plain step's, `plain`)."""
        meter = comm.TrafficMeter() if step in (self.measured, self.plain) else contextlib.nullcontext()
        t0 = time.perf_counter()
        with meter, Timeline() as calls:
            out = step_fn(step, res)
        totals.append(time.perf_counter() - t0)
        res.calls.append(calls)
        if step == self.measured:
            res.traffic, res.kinds = meter.summary(), by_kind(calls)
        elif step == self.plain:
            res.traffic_plain = meter.summary()
        return out


def by_kind(log: Timeline) -> dict[str, dict[str, int]]:
    """The traffic of `log`'s collectives and point-to-point posts, summed by kind (`comm.kinds`):
    kind -> {`Volume` field: total}."""
    out: dict[str, list[int]] = {}
    for c in (*log.calls, *log.p2p):
        if c.counts is not None:
            acc = out.setdefault(c.kind, [0] * len(FIELDS))
            for i, v in enumerate(c.counts):
                acc[i] += v
    return {k: dict(zip(FIELDS, v)) for k, v in sorted(out.items())}


def validate(cfg: TrainConfig, step: int, res: RankResult, evaluate, since: float) -> None:
    """After `step`, when due (every `eval_every` steps, and after the last): `evaluate()`'s loss
    into `res`, with the seconds since `since` it was taken at (its wall-clock axis)."""
    done = step + 1
    if done % cfg.training.eval_every == 0 or done == cfg.training.steps:
        res.val.append((done, evaluate()))
        res.val_at_s.append(time.perf_counter() - since)


def forward_backward(replica, schedule, batches: list, loss_scale, measure: bool,
                     res: RankResult) -> tuple[StepHooks, list[float]]:
    """`batches`' forward and backward passes in `schedule`'s order, gradients left in the
    replica's strategy; returns the step's hooks (seconds per phase) and the micro-batches' losses.
    When `measure`, the bytes saved for backward go into `res.activations`."""
    hooks = StepHooks(replica.model, measure=measure)
    losses = schedule.run(replica.model, replica.strategy, batches, loss_scale, hooks)
    if hooks.saved_bytes is not None:
        res.activations = hooks.saved_bytes
    return hooks, losses


def summarise(res: RankResult, totals: list[float], phases: list[dict], strategy) -> slice:
    """Step times, per-phase medians and the median rest (time outside every phase) of the steady
    steps (warm-up left out when there are enough steps) and `strategy`'s bucket layout, into `res`;
    returns the steady slice.

    The rest is taken step by step, then its median: medians do not add, so the step's median less
    the phases' medians can come out negative (a step whose optimizer ran long and another whose
    backward did). A step's total is perf_counter's, its phases time.time()'s: the two clocks can
    differ by a microsecond over a step, never by more, hence the floor at 0."""
    steady = slice(min(2, len(totals) - 1), None)
    res.step_times, res.calls, res.compress_s = totals[steady], res.calls[steady], res.compress_s[steady]
    res.step_time = statistics.median(res.step_times)
    res.phases = {k: statistics.median(p[k] for p in phases[steady]) for k in phases[0]}
    res.rest = statistics.median(max(0.0, t - sum(p.values())) for t, p in zip(res.step_times, phases[steady]))
    res.buckets = strategy.layout()
    return steady
