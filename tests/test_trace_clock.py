"""The merged clock keeps every rank's nesting, whatever its offsets do, and the traced ranks start
their first traced step together: spans nested on a rank's clock (a step holding its optimizer)
stay nested in `merged.json` under any drift of the measured offsets, and a rank slowed between
the clock anchor and the step does not let its peers into the step before it."""

import time

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.run.config import TrainConfig
from ringzero.trace import merge
from ringzero.trace.events import rank_events
from ringzero.trace.validate import problems
from ringzero.train.tracing import Seat, Tracer

T0 = 1_786_000_000.0
"""A `time.time()` reading of these years: its float keeps about 0.24 µs."""


def _rank1(spans: list[tuple[str, float, float]], drift_s: float, window_s: float = 0.1) -> dict:
    """Rank 1's traced data: `spans` (name, start, end; seconds after T0) on the main thread, its
    offset against rank 0 measured 0 at T0 and `drift_s` at T0 + `window_s`."""
    anchor = lambda at, off: {"at": at, "offsets": [{"offset_s": 0.0, "error_s": 0.0},
                                                    {"offset_s": off, "error_s": 1e-4}]}
    return {"rank": 1, "calls": [], "p2p": [], "clock": {"start": anchor(T0, 0.0), "end": anchor(T0 + window_s, drift_s)},
            "spans": [{"name": n, "cat": "step" if n.startswith("step") else "phase", "thread": "MainThread",
                       "start": T0 + a, "end": T0 + b, "args": {}} for n, a, b in spans]}


def _merged_problems(data: dict) -> list[str]:
    events = rank_events(data, merge.shift_of(data))
    return problems({"traceEvents": events})


def test_a_step_holds_its_optimizer_on_the_merged_clock_while_the_offset_drifts():
    # The optimizer ends 2 µs before its step; the offset falls 1 ms over the 100 ms between the
    # anchors, 0.3 ms of it between the step's start and the optimizer's. Mapping the starts alone
    # and keeping the raw lengths put the optimizer's end 0.3 ms past its step's.
    spans = [("step 3", 0.010, 0.050), ("forward", 0.010, 0.030), ("optimizer", 0.040, 0.049998)]
    assert _merged_problems(_rank1(spans, drift_s=0.0)) == []
    assert _merged_problems(_rank1(spans, drift_s=-1e-3)) == []
    assert _merged_problems(_rank1(spans, drift_s=+1e-3)) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=8),
       st.floats(-5e-3, 5e-3), st.floats(1e-3, 0.5))
def test_nested_spans_stay_nested_under_any_drift(cuts, drift_s, window_s):
    """Spans nested by construction (each inside the one before: a step, its phase, a collective in
    it...), at µs and sub-µs distances, on a window of any length against any drift."""
    a, b, spans = 0.0, 0.05, []
    for i, (x, y) in enumerate(cuts):
        lo, hi = sorted((x, y))
        a, b = a + (b - a) * lo / 1e6, a + (b - a) * hi / 1e6
        spans.append((f"step {i}" if i == 0 else f"phase {i}", a, b))
    assert _merged_problems(_rank1(spans, drift_s, window_s)) == []


def test_offsets_that_move_faster_than_the_clock_do_not_run_it_backwards():
    data = _rank1([], drift_s=0.2, window_s=0.1)           # noise, not a drift: 2 s per second
    shift = merge.shift_of(data)
    readings = [T0 + k * 1e-3 for k in range(-10, 120)]
    mapped = [shift(t) for t in readings]
    assert mapped == sorted(mapped)


class _SlowAnchor(Tracer):
    """Rank 1 takes `slow_s` longer after the clock anchor (a profiler's first start takes each
    rank its own time)."""
    slow_s = 0.3

    def _anchor(self) -> dict:
        out = super()._anchor()
        if not hasattr(self, "ready"):          # the anchor before the steps, not the one after
            if self.seat.rank == 1:
                time.sleep(self.slow_s)
            self.ready = time.time()
        return out


def _begin(group, folder):
    cfg = TrainConfig(model="nano", seq=16, micro_batch=1, steps=2, trace=folder, trace_steps="1:1")
    tracer = _SlowAnchor(cfg, Seat(dist.get_rank(group), 2, group), first=0)
    tracer.begin(0)
    entered = time.time()          # where the engine reads the step's start
    tracer.end(0, {}, entered, time.time())
    return {"ready": tracer.ready, "entered": entered}


@pytest.mark.timeout(120)
def test_no_rank_enters_the_first_traced_step_before_its_peers_are_ready(pool, tmp_path):
    """An order, not a duration: rank 0 may start the step only once rank 1 has finished what the
    tracer started, so the step does not open with rank 0 waiting for it."""
    r0, r1 = pool.run(_begin, str(tmp_path), world=2)
    assert r0["entered"] >= r1["ready"], (r0, r1)
