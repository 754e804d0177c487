"""`simulate_step` with a run's measured rates (`step_costs.Measured`): the step is the blocks' FLOPs
at the measured rate, each call's host price on the compute's time, the optimizer at its rate;
and the same played on a real run's probes stays beside the planner twin's sum."""

from __future__ import annotations

import pytest

from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import hardware
from ringzero.plan.model.flops import layer_flops_per_token
from ringzero.plan.model.presets import model
from ringzero.plan.model.shapes import param_count
from ringzero.plan.pipeline.layout import head_flops_per_token, stage_params
from ringzero.plan.strategies.sharding import padded_numel
from ringzero.run.config import TrainConfig
from ringzero.simulate import local
from ringzero.simulate.grid import Grid
from ringzero.simulate.measured import Measured
from ringzero.simulate.training import simulate_step
from ringzero.train.rank import train_rank
from ringzero.twin import report
from ringzero.twin.simulated import plays

A100 = hardware("a100-80gb")
FLOPS, PER_PARAM, CALL = 2e10, 3e-9, 1e-3


def _host(dim, collective, algorithm, n, count, itemsize):
    return CALL + count * itemsize * 1e-10


def _step(zero: int, inline: bool, buckets=None, gathers=None, recompute="selective"):
    m = model("gpt2")
    tr, par = Training(micro_batch=2, global_batch=8), Parallel(dp=4, zero=zero, recompute=recompute)
    measured = Measured(FLOPS, PER_PARAM, _host, buckets, gathers, inline)
    topo = local.emulated_topology(4, 4, 1.0, 0.0)         # one node: no link is emulated
    return m, tr, par, simulate_step(m, tr, par, A100, topo, Grid(4, 1, 1), measured=measured)


@pytest.mark.parametrize("zero", [0, 2])
def test_the_step_is_the_measured_flops_the_calls_host_price_and_the_optimizer(zero):
    buckets, gathers = (3_000_000, 1_000_000), (1_000_000, 250_000)
    m, tr, par, sim = _step(zero, True, buckets, gathers)
    tokens, micro = tr.micro_batch * m.seq, tr.accumulation(par.dp)
    count = param_count(m)
    rest = count.total - m.layers * count.per_layer - m.hidden * m.vocab     # the position table, the final norm
    assert rest > 0
    per_token = m.layers * layer_flops_per_token(m, par.recompute) + head_flops_per_token(m) + 6 * rest
    compute = micro * tokens * per_token / FLOPS
    times = micro if zero == 2 else 1                 # ZeRO-2 reduces after every micro-batch
    reduced = times * sum(_host("dp", "", "", 4, c, 2) for c in buckets)
    gathered = sum(_host("dp", "", "", 4, c, 2) for c in gathers) if zero else 0.0
    held = stage_params(m, 1, 0, 1)
    optimizer = (padded_numel(held, 4) // 4 if zero else held) * PER_PARAM
    parts = sim.parts
    assert parts["compute"] == pytest.approx(compute, rel=1e-9)
    assert parts["dp"] == pytest.approx(reduced, rel=1e-4)   # + the played links: the free NVSwitch, ns
    assert parts["weight_gather"] == pytest.approx(gathered, rel=1e-4)
    assert parts["optimizer"] == pytest.approx(optimizer, rel=1e-6)
    assert sim.seconds == pytest.approx(compute + reduced + gathered + optimizer, rel=1e-4)


def test_beside_compute_the_buckets_hide_and_inline_they_do_not():
    *_, inline = _step(0, True, (3_000_000, 1_000_000))
    *_, beside = _step(0, False, (3_000_000, 1_000_000))
    assert beside.parts["compute"] == pytest.approx(inline.parts["compute"])
    assert beside.parts["dp"] < inline.parts["dp"]      # only the last bucket's tail is exposed
    assert beside.seconds < inline.seconds


def test_the_simulator_plays_grid_runs_and_names_what_it_does_not():
    assert plays(TrainConfig(strategy="zero2"))
    assert not plays(TrainConfig(strategy="dp", compress="powersgd"))
    assert not plays(TrainConfig(strategy="ps", servers=1))
    assert not plays(TrainConfig(strategy="zero3", offload_params="cpu"))


def _train(group, cfg):
    return train_rank(cfg, group=group)


@pytest.mark.timeout(300)
def test_a_runs_simulated_step_stands_beside_its_planner_twin(pool):
    # Both are predictions from the same probes (no wall clock is compared): the simulator's step is
    # the planner twin's sum played as events, so they differ only in what the play does
    # differently (a block's FLOPs without the embeddings' 6 per parameter, the gradient norm's sum).
    cfg = TrainConfig(strategy="zero2", model="nano", seq=32, micro_batch=2, steps=6, eval_every=1000,
                      eval_batches=1, max_bytes=1 << 16)
    rows = {t.name: t for t in report.twins(cfg, 2, pool.run(_train, cfg, world=2))}
    planned, simulated = rows["step time"], rows["step time, simulated (the step's events played)"]
    assert simulated.measured == planned.measured
    assert 0.5 * planned.predicted < simulated.predicted < 1.5 * planned.predicted
