"""Properties of the planner's formulas (hypothesis): sharding never adds memory, ZeRO-3 shards add
up to the unsharded states, the ring's volume tends to 2Φ, activations shrink with every technique."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.plan.model import activations as act
from ringzero.plan.comm.volume import call_for, volume
from ringzero.plan.config import OPTIMIZERS, PRECISIONS, Parallel, Training
from ringzero.plan.strategies.memory import memory, model_states, state_bytes
from ringzero.plan.model.shapes import ModelShape

PARAMS = st.integers(min_value=1, max_value=10**12)
WORLD = st.integers(min_value=1, max_value=4096)
STATES = st.builds(state_bytes, st.sampled_from(PRECISIONS), st.sampled_from(OPTIMIZERS))


@st.composite
def shapes(draw):
    heads = draw(st.sampled_from([1, 2, 4, 8, 16]))
    return ModelShape(layers=draw(st.integers(1, 48)), hidden=heads * draw(st.integers(1, 128)),
                      heads=heads, vocab=draw(st.integers(2, 70000)), seq=draw(st.integers(1, 4096)),
                      gated=draw(st.booleans()), bias=draw(st.booleans()), tied=draw(st.booleans()))


@given(PARAMS, STATES, WORLD, st.integers(1, 8), st.integers(1, 8))
def test_more_zero_sharding_never_adds_memory(n, sb, dp, tp, pp):
    totals = [sum(model_states(n, sb, dp, stage, tp, pp)[:3]) for stage in range(4)]
    assert totals == sorted(totals, reverse=True)


@given(PARAMS, STATES, WORLD)
def test_zero3_shards_add_up_to_the_unsharded_states(n, sb, dp):
    unsharded = sum(model_states(n, sb)[:3])
    sharded = sum(model_states(n, sb, dp, 3)[:3]) * dp
    assert unsharded <= sharded < unsharded + dp * sb.total     # equal up to padding to equal shards


@given(PARAMS, STATES, WORLD, st.integers(1, 3))
def test_offload_moves_the_optimizer_off_the_gpu(n, sb, dp, stage):
    on_gpu = model_states(n, sb, dp, stage)
    off = model_states(n, sb, dp, stage, offload="cpu")
    assert off[:2] == on_gpu[:2] and off[2] == 0 and off[3] == on_gpu[2]


@given(st.integers(2, 2048), st.integers(1, 10**10))
def test_ring_volume_tends_to_twice_the_buffer(n, count):
    sent = volume(call_for("all_reduce", "ring", n, count, 2), 0).bytes_sent
    phi = 2 * count
    assert sent <= 2 * phi
    assert abs(sent - 2 * (n - 1) / n * phi) <= 2 * 2 * n        # exact chunks differ by < 1 element each
    if n >= 1024 and count >= 10**6:
        assert sent >= 0.998 * 2 * phi


@settings(max_examples=60)
@given(shapes(), st.integers(1, 8), st.sampled_from(["fp32", "bf16"]), st.booleans())
def test_activation_techniques_only_shrink_activations(m, b, precision, dropout):
    kw = dict(value_bytes=4 if precision == "fp32" else 2, dropout=dropout)
    none = act.layer_bytes(m, b, m.seq, **kw)
    assert act.layer_bytes(m, b, m.seq, recompute="selective", **kw) <= none
    assert act.layer_bytes(m, b, m.seq, recompute="full", **kw) <= act.layer_bytes(m, b, m.seq, recompute="selective", **kw)
    if m.heads % 2 == 0:
        tp = act.layer_bytes(m, b, m.seq, tp=2, **kw)
        assert tp <= none and act.layer_bytes(m, b, m.seq, tp=2, sp=True, **kw) <= tp


@settings(max_examples=60)
@given(shapes(), st.integers(1, 64), st.integers(1, 4))
def test_memory_total_is_the_sum_of_its_parts_and_shrinks_with_zero(m, dp, b):
    tr = Training(micro_batch=b)
    mems = [memory(m, tr, Parallel(dp=dp, zero=z)) for z in range(4)]
    for mem in mems:
        assert mem.total == mem.params + mem.grads + mem.optimizer + mem.activations + mem.buffers
    states = [x.model_states for x in mems]
    assert states == sorted(states, reverse=True)
