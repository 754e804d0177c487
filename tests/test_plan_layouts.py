"""Layouts in the planner against the papers: tensor-parallel collectives under recomputation,
pipeline traffic under tensor parallelism (scatter/gather), the interleaved schedule's bubble,
activations and messages, which layouts can exist at all, the busiest stage of an uneven cut, and
the presets' training recipes."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.plan.model import activations as act
from ringzero.plan.search import layout_check
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.strategies import tensor_parallel
from ringzero.plan.config import Parallel, Training
from ringzero.plan.estimate import estimate
from ringzero.plan.hardware import hardware
from ringzero.plan.strategies.memory import buffer_bytes, memory, model_states, state_bytes
from ringzero.plan.pipeline.layout import chunk_layers, memory_candidates, stage_params
from ringzero.plan.model.presets import ALIASES, MODELS, RECIPES, model, recipe
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.strategies.traffic import pipeline_ops, tensor_parallel_ops

GPT3, LLAMA7, LLAMA70 = model("gpt3-175b"), model("llama-2-7b"), model("llama-2-70b")
A100 = hardware("a100-80gb")


def _calls(sp: bool, recompute: str, replay: str) -> dict[str, int]:
    return {c: k for _, c, k in tensor_parallel.layer_collectives(sp, recompute, replay)}


# Tensor-parallel collectives under recomputation.

@pytest.mark.parametrize("recompute, replay, per_layer", [
    ("none", "whole", 4), ("selective", "whole", 4),     # the attention core holds no tp collective
    ("full", "whole", 6),                                 # 2 forward + 2 recomputed + 2 backward
    ("none", "early-stop", 4), ("selective", "early-stop", 4),
    ("full", "early-stop", 5),                            # the last reduction is not replayed
])
def test_all_reduces_per_layer(recompute, replay, per_layer):
    assert _calls(False, recompute, replay) == {"all_reduce": per_layer}
    sp = _calls(True, recompute, replay)          # each all-reduce: a reduce-scatter and an all-gather
    assert sp["reduce_scatter"] == per_layer
    assert sp["all_gather"] == (6 if recompute == "full" else 4)


def test_gpt3_tensor_parallel_bytes_under_full_recomputation():
    # 175B on tp 8 x pp 16: 6 layers per stage; ring all-reduce 2(t-1)/t·bsh per call.
    tr, b, s, h, t = Training(micro_batch=1, global_batch=8), 1, 2048, 12288, 8
    per_call = 2 * (t - 1) / t * b * s * h * 2
    for recompute, replay, n in (("none", "whole", 4), ("full", "whole", 6), ("full", "early-stop", 5)):
        par = Parallel(dp=1, tp=t, pp=16, recompute=recompute, recompute_replay=replay)
        (op,) = tensor_parallel_ops(GPT3, tr, par, 8)
        assert op.calls == n * 6 * 8 and op.bytes_sent == pytest.approx(n * 6 * 8 * per_call)
    with pytest.raises(ValueError, match="recompute_replay='all' is not supported; allowed: whole, early-stop"):
        Parallel(recompute_replay="all")


def test_engine_plans_with_its_own_replay():
    from ringzero.twin import predict
    from ringzero.run.config import TrainConfig
    _, _, par = predict.plan_inputs(TrainConfig(tp=2, recompute="full"), 2)
    assert par.recompute_replay == "early-stop" and Parallel().recompute_replay == "whole"


# Pipeline traffic under tensor parallelism: Megatron's scatter/gather.

def test_scatter_gather_sends_a_slice_and_all_gathers_it_inside_the_node():
    b, s, h, k, t = 1, 2048, 12288, 2, 8
    tr = Training(micro_batch=b, global_batch=8)
    plain, gather = pipeline_ops(GPT3, tr, Parallel(tp=t, pp=16), 8)
    assert plain.count == b * s * h // t and plain.spans_nodes               # 1/t on the network
    assert plain.calls == 2 * 8 and plain.bytes_sent == 2 * 8 * b * s * h * k / t
    # each arriving slice is rebuilt: an all-gather of b·s·h over the tp group, on NVLink
    assert (gather.kind, gather.collective, gather.group, gather.count) == ("tp", "all_gather", t, b * s * h)
    assert not gather.spans_nodes and gather.calls == plain.calls
    assert gather.bytes_sent == pytest.approx(gather.calls * (t - 1) / t * b * s * h * k)
    (sp,) = pipeline_ops(GPT3, tr, Parallel(tp=t, pp=16, sequence_parallel=True), 8)
    assert sp == plain                          # sequence parallelism's shard is already 1/t


def test_scatter_gather_twins_the_engines_arrivals():
    # The engine all-gathers every activation and gradient a stage receives (predict_pipeline.tp_calls).
    tr, p = Training(micro_batch=1, global_batch=8), 4
    for schedule, v in (("1f1b", 1), ("interleaved", 2)):
        _, gather = pipeline_ops(LLAMA7, tr, Parallel(tp=2, pp=p, schedule=schedule, virtual_stages=v), 8)
        n = pipeline.messages(1, p, 8, schedule, v)
        assert gather.calls == n["activations_received"] + n["gradients_received"]


# The interleaved schedule (Narayanan et al. 2021 §2.2.2).

@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 9, 3), (8, 16, 2)])
def test_interleaved_bubble_is_the_papers(p, m, v):
    f, b = 1.0, 2.0
    timeline = pipeline.simulate(p, m, "interleaved", v, forward=f, backward=b)
    span = max(e for stage in timeline for _, _, e in stage) - min(s for stage in timeline for _, s, _ in stage)
    ideal = m * (f + b)
    assert (span - ideal) / ideal == pytest.approx((p - 1) / (v * m))            # t_pb / t_id
    assert pipeline.bubble_fraction(p, m, "interleaved", v) == pytest.approx((p - 1) / (v * m + p - 1))
    assert pipeline.idle_fraction(timeline) == pytest.approx((p - 1) / (v * m + p - 1))


@pytest.mark.parametrize("p, v", [(2, 2), (4, 2), (4, 3), (8, 2)])
def test_interleaved_first_stage_holds_more(p, v):
    m, layers = 4 * p, 2 * p * v                          # enough micro-batches to finish the warm-up
    for i in range(p):
        assert pipeline.inflight(i, p, m, "interleaved", v) == 2 * (p - i - 1) + (v - 1) * p + 1
        assert pipeline.inflight(i, p, m, "1f1b") == p - i
    # In blocks: L·(1 + (p-1)/(p·v)) on the first stage against 1F1B's L (Korthikanti et al. 2022 §4.2.3).
    held = act.stage_activation_layers(layers, p, m, "interleaved", v)
    assert held == pytest.approx(layers * (1 + (p - 1) / (p * v)))
    assert act.stage_activation_layers(layers, p, m, "1f1b") == layers


def test_interleaved_sends_v_times_the_messages():
    tr, p = Training(micro_batch=1, global_batch=16), 4
    one = pipeline_ops(LLAMA7, tr, Parallel(pp=p), 8)[0]
    for v in (2, 4):
        inter = pipeline_ops(LLAMA7, tr, Parallel(pp=p, schedule="interleaved", virtual_stages=v), 8)[0]
        assert inter.calls == v * one.calls == 2 * v * 16 and inter.bytes_sent == v * one.bytes_sent
        sent = pipeline.messages(1, p, 16, "interleaved", v)
        assert sent["activations_sent"] + sent["gradients_sent"] == inter.calls


# Layouts that cannot exist.

@pytest.mark.parametrize("m, par, message", [
    (LLAMA7, Parallel(tp=3), "tp=3 must divide the 32 attention heads; allowed: 1, 2, 4, 8, 16, 32"),
    (LLAMA7, Parallel(tp=64), "tp=64 must divide the 32 attention heads"),
    (LLAMA70, Parallel(tp=16), "tp=16 must divide the 64 attention heads and the 8 kv heads; allowed: 1, 2, 4, 8"),
    (dataclasses.replace(LLAMA7, ffn=11000), Parallel(tp=16), "tp=16 must divide the MLP width ffn=11000; "
                                                              "allowed: 1, 2, 4, 8"),
    (dataclasses.replace(LLAMA7, seq=1000), Parallel(tp=16, sequence_parallel=True),
     "sequence_parallel needs tp=16 to divide the sequence length 1000; allowed: tp in 2, 4, 8, or no"),
    (LLAMA7, Parallel(pp=64), "pp=64 is more stages than the 32 layers; allowed: 1-32"),
])
def test_impossible_layouts_are_rejected_in_one_line(m, par, message):
    with pytest.raises(ValueError, match=message) as err:
        layout_check.check(m, par)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message):
        estimate(m, Training(global_batch=64), par, A100)


def test_possible_layouts_pass():
    for m, par in ((LLAMA7, Parallel(tp=8, pp=7)), (LLAMA70, Parallel(tp=8, pp=80, sequence_parallel=True)),
                   (GPT3, Parallel(tp=8, pp=16))):
        assert layout_check.problem(m, par) is None


# The busiest stage of a pipeline: its parameters and its activations.

def _stage_total(m: ModelShape, tr: Training, par: Parallel, stage: int) -> int:
    """One stage's bytes from its own parameters and chunks, independently of `memory`."""
    v = par.virtual_stages
    p, g, o, _ = model_states(stage_params(m, par.tp, stage, par.pp, v), state_bytes(tr.precision, tr.optimizer),
                              par.dp, par.zero, offload=par.offload)
    kw = dict(value_bytes=tr.bytes_per_value, dropout=tr.dropout_for(m), tp=par.tp, sp=par.sequence_parallel)
    chunks = tuple(len(r) for r in chunk_layers(m, par.pp * v))
    head = act.head_bytes(m, tr.micro_batch, m.seq, value_bytes=tr.bytes_per_value, tp=par.tp)
    a = act.activation_bytes(m, tr.micro_batch, m.seq, pp=par.pp, microbatches=tr.accumulation(par.dp),
                             schedule=par.schedule, virtual_stages=v, recompute=par.recompute, stage=stage,
                             chunks=chunks, head=head, **kw)
    return p + g + o + math.ceil(a) + buffer_bytes(m, tr, par)


def test_uneven_stages_price_the_busiest_stage():
    # 32 layers on 7 stages: the cut is 4, 4, 5, 5, 5, 5, 4 blocks, not 32/7 each.
    tr, par = Training(micro_batch=1, global_batch=7), Parallel(pp=7)
    assert [len(r) for r in chunk_layers(LLAMA7, 7)] == [4, 4, 5, 5, 5, 5, 4]
    totals = [_stage_total(LLAMA7, tr, par, i) for i in range(7)]
    assert memory(LLAMA7, tr, par).total == max(totals)
    # the first stage, with the embedding and 7 micro-batches of 4 blocks in flight, is the busiest
    assert memory(LLAMA7, tr, par).params == stage_params(LLAMA7, 1, 0, 7) * 2


def test_first_stage_holds_the_embedding():
    # GPT-3 on tp 8 x pp 16: the first stage's tp rank holds 6 blocks and 1/8 of the embedding,
    # 7 % more than Ψ/(tp·pp).
    e = estimate(GPT3, Training(micro_batch=1, global_batch=16), Parallel(tp=8, pp=16), A100)
    first = stage_params(GPT3, 8, 0, 16)
    assert e.memory.params == 2 * first
    assert first / (e.params.total / 128) == pytest.approx(1.072, abs=0.002)


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 24), p=st.integers(2, 6), v=st.integers(1, 3), groups=st.integers(1, 3),
       schedule=st.sampled_from(pipeline.SCHEDULES), recompute=st.sampled_from(("none", "full")))
def test_memory_is_the_busiest_of_every_stage(layers, p, v, groups, schedule, recompute):
    v = v if schedule == "interleaved" else 1
    if p * v > layers:
        return
    m = ModelShape(layers=layers, hidden=64, heads=4, vocab=1000, seq=32)
    tr = Training(micro_batch=1, global_batch=groups * p)
    par = Parallel(pp=p, schedule=schedule, virtual_stages=v, recompute=recompute)
    totals = [_stage_total(m, tr, par, i) for i in range(p)]
    assert memory(m, tr, par).total == max(totals) == max(totals[i] for i in memory_candidates(m, p, v))


# Presets' training recipes.

def test_every_preset_has_a_recipe():
    assert set(RECIPES) == set(MODELS)
    assert recipe("LLaMA-2-7B") == RECIPES["llama-2-7b"] and recipe("gpt3") == RECIPES["gpt3-175b"]
    assert all(recipe(a) == RECIPES[k] for a, k in ALIASES.items())
    assert not any(recipe(n).dropout for n in MODELS if n.startswith("llama"))
    assert all(recipe(n).dropout for n in MODELS if n.startswith("gpt"))
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        recipe("gpt5")


def test_llama_2_7b_zero3_fits_8_a100_80gb_with_its_recipe():
    # LLaMA was trained without dropout: its masks and dropped attention weights are not saved.
    par = Parallel(dp=8, zero=3)
    trained = estimate(LLAMA7, Training(micro_batch=1, dropout=recipe("llama-2-7b").dropout), par, A100)
    dropped = estimate(LLAMA7, Training(micro_batch=1, dropout=True), par, A100)
    assert trained.fits and trained.memory.total == pytest.approx(69.8e9, rel=1e-3)
    assert not dropped.fits and dropped.memory.total == pytest.approx(122.4e9, rel=1e-3)
