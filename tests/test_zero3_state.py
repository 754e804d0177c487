"""ZeRO-3's own training state and its prefetch depth, on one rank (the gathers still run on the
communication thread): the layers it holds gathered at once are the planner's
`zero3_layers_held`, a recomputed forward prefetches nothing, and no private autograd attribute
tells it where it is."""

from __future__ import annotations

import pathlib

import pytest
import torch

from ringzero.parallel.recompute import apply_recompute
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.parallel.strategies import apply_sharding
from ringzero.parallel.topology import Topology
from ringzero.parallel.zero.zero3 import TrainingState
from ringzero.plan.config import Parallel, Training
from ringzero.plan.model.presets import model as preset
from ringzero.plan.model.shapes import param_count
from ringzero.plan.strategies.memory import buffer_bytes, state_bytes, zero3_layers_held
from ringzero.plan.strategies.sharding import ZERO3
from ringzero.run.config import TrainConfig
from ringzero.train.model import GPT

CFG = TrainConfig(model="nano", seq=32, layers=4, strategy="zero3")


def _step(prefetch: int, recompute: str = "none"):
    """One forward and backward of a 4-layer GPT under ZeRO-3: (the strategy, its reduced gradients,
    the states seen by a layer's forward and by a gradient hook, the gathers issued)."""
    torch.manual_seed(0)
    model = apply_recompute(GPT(CFG.shape), recompute)
    sh = apply_sharding(model, Topology.alone(), ShardingConfig(sharding=ZERO3, prefetch=prefetch))
    seen, gathers, real = [], [], sh.policies.gather.gather
    sh.policies.gather.gather = lambda g, src: (gathers.append(g.index), real(g, src))[1]
    sh._units[0][0].register_forward_pre_hook(lambda m, a: seen.append(("forward", sh.state)))
    x = torch.randint(0, CFG.shape.vocab, (2, CFG.shape.seq))
    try:
        assert sh.state is TrainingState.IDLE
        loss = model(x, x)
        next(sh._units[0][0].parameters()).register_hook(lambda g: seen.append(("grad", sh.state)))
        loss.backward()
        sh.finish_backward()
        assert sh.state is TrainingState.IDLE
        return sh, [t.clone() for t in sh.reduced_grads()], seen, gathers
    finally:
        sh.close()


@pytest.mark.parametrize("prefetch", [0, 1, 2, 3])
def test_layers_held_at_once_are_the_planners(prefetch):
    sh, _, _, _ = _step(prefetch)
    want = zero3_layers_held(prefetch, CFG.shape.layers)
    assert sh.peak_gathered == {TrainingState.FORWARD: want, TrainingState.BACKWARD: want}


def test_prefetch_depth_changes_no_value():
    grads = [_step(d)[1] for d in (0, 1, 3)]
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_states_follow_the_hooks_and_a_recomputed_forward_gathers_nothing_more(recompute):
    _, grads, seen, gathers = _step(1, recompute)
    assert seen == [("forward", TrainingState.FORWARD), ("grad", TrainingState.BACKWARD)]
    layers = CFG.shape.layers
    assert len(gathers) == 1 + 2 * layers           # the root once, every layer before forward and backward
    if recompute == "full":
        plain = _step(1)[1]
        assert all(torch.equal(a, b) for a, b in zip(grads, plain))


def test_the_planners_buffers_read_the_depth():
    m, tr = preset("llama-2-7b"), Training()
    sb, layer = state_bytes(tr.precision, tr.optimizer), param_count(preset("llama-2-7b")).per_layer
    for d in (0, 1, 2):
        got = buffer_bytes(m, tr, Parallel(dp=8, zero=3, prefetch=d))
        assert got == -(-(layer * ((1 + d) * sb.weights + sb.grads)) // 1)
    assert zero3_layers_held(5, 3) == 3                  # never more layers than the model has
    with pytest.raises(ValueError, match="prefetch"):
        Parallel(dp=8, zero=3, prefetch=-1)
    with pytest.raises(ValueError, match="prefetch"):
        ShardingConfig(sharding=ZERO3, prefetch=True)


def test_no_private_autograd_attribute_tells_zero3_where_it_is():
    src = pathlib.Path(__file__).parents[1] / "src" / "ringzero"
    users = [p for p in src.rglob("*.py") if "_current_graph_task_id" in p.read_text()]
    assert users == []
