"""Pipeline parallelism for a model other than ringzero's GPT: an `nn.Sequential` cut at named
children, run by the same schedules, gives the losses and gradients of the uncut model."""

import pytest
import torch
from torch import nn

from ringzero.parallel.pp.pipeline import apply_pipeline
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.parallel.strategies import apply_sharding
from ringzero.parallel.topology import Topology
from ringzero.plan.placement import Placement
from ringzero.train.pipeline_schedule import PipelineSchedule
from ringzero.train.step_schedule import StepHooks

WIDTH, BATCH, MICRO = 16, 4, 3


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                         nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, 1))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(MICRO)]


def _loss(out, y):
    return nn.functional.mse_loss(out, y)


def _pipelined(group, schedule, cut_at):
    """This stage's losses and its parameters' gradients (summed over the micro-batches), by name."""
    topo = Topology.build(Placement(dp=1, tp=1, pp=len(cut_at) + 1), group)
    model = _model()
    stages = apply_pipeline(model, topo, cut_at=cut_at, loss_fn=_loss)
    strategy = apply_sharding(model, topo, ShardingConfig())
    losses = PipelineSchedule(stages, topo, schedule, 1, (BATCH, WIDTH), torch.float32).run(
        model, strategy, _batches(), 1.0, StepHooks(model))
    names = {id(p): n for n, p in model.named_parameters()}
    grads = {names[id(p)]: v.clone() for g, flat in zip(strategy.groups, strategy.reduced_grads())
             for p, v in zip(g.params, g.bucket.views(flat))}
    strategy.close()
    return losses, grads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_sequential_model_cut_at_names_has_the_uncut_gradients(pool, schedule):
    model = _model()
    want = []
    for x, y in _batches():
        loss = _loss(model(x), y)
        want.append(loss.item())
        loss.backward()
    out = pool.run(_pipelined, schedule, ["2", "4"], world=3)
    assert out[-1][0] == pytest.approx(want, rel=1e-6) and out[0][0] == []
    got = {n: g for _, grads in out for n, g in grads.items()}
    assert set(got) == {n for n, _ in model.named_parameters()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-6, atol=1e-7)


class _ThreeStages:
    pp, pp_rank, tp = 3, 0, 1


@pytest.mark.parametrize("cut_at, match", [(["2", "9"], "no child named '9'"), (["4", "2"], "in model order"),
                                           (["2"], "make 2 stages, not pp=3"), (["0", "2"], "after the first")])
def test_bad_cut_points_are_one_line(cut_at, match):
    with pytest.raises(ValueError, match=match):
        apply_pipeline(_model(), _ThreeStages(), cut_at=cut_at, loss_fn=_loss)
