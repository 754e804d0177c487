"""The straggler's compute on ranks that share cores (`twin.straggler`): the closed-form
steady state against the step-by-step play of the same fluid model, its limits, and where the step
prediction uses it (the straggler's rank, with its rate alone probed)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.twin import step as predict_step
from ringzero.run.config import TrainConfig
from ringzero.twin.straggler import straggler_pass_seconds

BASE = dict(model="nano", seq=32, micro_batch=2, eval_every=1000, eval_batches=1, max_bytes=1 << 16)


def _play(alone: float, together: float, world: int, factor: float, steps: int = 400) -> float:
    """The steps one after another: R sleeps for its last pass x (F - 1) while the peers compute,
    then all share the cores until the peers are done, then R finishes alone. Returns the last pass."""
    s_all = alone / together
    s_peers = min(1.0, s_all * world / (world - 1))
    last = together
    for _ in range(steps):
        sleep = (factor - 1.0) * last
        left = max(0.0, alone - sleep * s_peers)      # each peer's work left, in seconds alone
        both = min(left, alone)                        # R keeps pace with the peers while all compute
        last = both / s_all + (alone - both)
    return last


@settings(max_examples=300, deadline=None)
@given(alone=st.floats(0.01, 1.0), contention=st.floats(1.0, 4.0), world=st.integers(2, 16),
       factor=st.floats(1.0, 8.0))
def test_the_closed_form_is_the_steady_state_of_the_steps(alone, contention, world, factor):
    together = alone * contention
    s_all = 1 / contention
    s_peers = min(1.0, s_all * world / (world - 1))
    k = contention - 1
    # the recurrence converges where its slope, (F - 1)·s_peers·k, is below 1 (or the peers finish)
    if (factor - 1) * s_peers < 1 and (factor - 1) * s_peers * k > 0.95:
        return
    assert straggler_pass_seconds(alone, together, world, factor) == pytest.approx(
        _play(alone, together, world, factor), rel=1e-6)


def test_the_limits():
    assert straggler_pass_seconds(0.1, 0.1, 4, 2.0) == 0.1             # no contention: alone
    assert straggler_pass_seconds(0.1, 0.2, 4, 1.0) == pytest.approx(0.2)   # no sleep: together
    assert straggler_pass_seconds(0.1, 0.2, 4, 9.0) == 0.1             # peers done in the sleep
    assert straggler_pass_seconds(0.1, 0.2, 1, 2.0) == 0.2             # nobody to wait for it
    # 4 ranks on 2 cores, factor 2: s_all = 1/2, s_peers = 2/3, c = 2·alone / (1 + 2/3)
    assert straggler_pass_seconds(0.1, 0.2, 4, 2.0) == pytest.approx(0.12)


def test_the_step_prices_the_straggler_at_its_share_of_the_cores():
    cfg = TrainConfig(strategy="dp", straggler=(1, 2.0), **BASE)
    rates = {"flops": 1e9, "optimizer_s_per_param": 1e-8}
    alone = {**rates, "alone_flops": 2e9}                      # twice as fast with the cores to itself
    pooled = predict_step.arithmetic_seconds(cfg, 4, rates, rank=1)
    assert predict_step.arithmetic_seconds(cfg, 4, alone, rank=1) == pytest.approx(0.6 * pooled)
    assert predict_step.arithmetic_seconds(cfg, 4, alone, rank=0) == pooled     # not the straggler
    steps = predict_step.step_seconds(cfg, 4, [(100_000, True)], alone, rank=1)
    assert steps["straggler"] == pytest.approx(steps["compute"])         # (2 - 1) x its compute
    assert steps["step"] == pytest.approx(sum(steps[k] for k in ("compute", "bubble", "straggler", "comm",
                                                                  "optimizer")))
