"""The whole-plan estimate and its JSON schema; validation of the planner's inputs."""

from __future__ import annotations

import json

import pytest

from ringzero.plan.config import Parallel, Training
from ringzero.plan.estimate import SCHEMA, estimate, to_dict
from ringzero.plan.hardware import Hardware, hardware
from ringzero.plan.model.presets import MODELS, TRAINED_TOKENS, model
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.strategies.traffic import KINDS

A100 = hardware("a100-80gb")

PUBLISHED = {   # parameter counts of the released checkpoints
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200, "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192, "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_match_published_parameter_counts(name):
    assert param_count(model(name)).total == PUBLISHED[name]


def test_llama7b_zero3_fits_on_8_a100_80gb():
    # The worked ZeRO example: ZeRO-3 cuts per-GPU model states from 112 GB to 14 GB, so a 7B model
    # trains on 8 A100-80GB (Rajbhandari et al. 2020: 16Ψ/N_d).
    tr = Training(micro_batch=1)
    e = estimate(model("llama-2-7b"), tr, Parallel(dp=8, zero=3, recompute="full"), A100)
    assert e.fits and e.memory.model_states == pytest.approx(16 * e.params.total / 8, abs=16)
    assert not estimate(model("llama-2-7b"), tr, Parallel(dp=8, zero=0), A100).fits


def test_json_schema_keys_and_consistency():
    e = estimate(model("llama-2-7b"), Training(micro_batch=2, global_batch=64, tokens=1e12),
                 Parallel(dp=8, tp=2, pp=2, zero=1, sequence_parallel=True, recompute="selective"),
                 hardware("h100-sxm"), days=30)
    d = json.loads(json.dumps(to_dict(e)))
    assert d["schema"] == SCHEMA
    assert {"params", "flops_per_step", "flops_total", "memory", "fits", "comm", "time", "mfu",
            "tokens_per_s", "inputs"} <= set(d)
    mem = d["memory"]
    assert mem["total"] == pytest.approx(sum(mem[k] for k in ("params", "grads", "optimizer", "activations", "buffers")))
    assert set(d["comm"]) == set(KINDS) and all(d["comm"][k] > 0 for k in ("zero", "tp", "pp"))
    assert d["comm"]["dp"] == 0                       # ZeRO-1 replaces the plain all-reduce
    t = d["time"]
    assert t["step"] == pytest.approx(t["compute"] + t["exposed_comm"] + t["bubble"] + t["offload"]
                                      + t["optimizer"])
    assert 0 <= t["exposed_comm"] <= t["comm"]
    assert d["tokens_per_s"] == pytest.approx(64 * 4096 / t["step"])
    assert d["inputs"]["parallel"]["tp"] == 2 and d["inputs"]["gpus"] == 32
    assert d["gpus_for_days"]["days"] == 30 and d["gpus_for_days"]["gpus"] >= 1
    assert sum(op["bytes"] for op in d["comm_ops"]) == pytest.approx(sum(d["comm"].values()))


def test_full_recomputation_costs_a_forward():
    tr = Training(micro_batch=1)
    base = estimate(model("gpt2"), tr, Parallel(), A100)
    full = estimate(model("gpt2"), tr, Parallel(recompute="full"), A100)
    assert full.flops_per_step == pytest.approx(base.flops_per_step * 8 / 6)
    assert full.memory.activations < base.memory.activations
    assert full.mfu < base.mfu                      # MFU counts 6N: recomputation is overhead


def test_dp_all_reduce_changes_link_across_nodes():
    tr = Training(micro_batch=1)
    inside = estimate(model("llama-2-7b"), tr, Parallel(dp=8), A100)
    across = estimate(model("llama-2-7b"), tr, Parallel(dp=64), A100)
    assert not inside.ops[0].spans_nodes and across.ops[0].spans_nodes
    assert across.time.comm > inside.time.comm


def test_offload_moves_states_and_costs_time():
    tr = Training(micro_batch=1)
    on = estimate(model("llama-2-7b"), tr, Parallel(dp=8, zero=2), A100)
    off = estimate(model("llama-2-7b"), tr, Parallel(dp=8, zero=2, offload="cpu"), A100)
    assert off.memory.optimizer == 0 and off.memory.offloaded == on.memory.optimizer
    assert off.time.offload > 0 == on.time.offload


def test_default_tokens_and_preset_tokens():
    e = estimate(model("gpt2"), Training(), Parallel(), A100)
    assert e.tokens == 20 * e.params.total
    assert TRAINED_TOKENS["gpt3-175b"] == 300e9 and set(TRAINED_TOKENS) <= set(MODELS)


@pytest.mark.parametrize("make, message", [
    (lambda: ModelShape(layers=2, hidden=100, heads=3, vocab=10, seq=8), "divisible by heads"),
    (lambda: ModelShape(layers=2, hidden=64, heads=4, kv_heads=3, vocab=10, seq=8), "kv_heads=3"),
    (lambda: ModelShape(layers=0, hidden=64, heads=4, vocab=10, seq=8), "layers must be >= 1"),
    (lambda: ModelShape(layers=2, hidden=64, heads=4, vocab=10, seq=8, norm="batch"), "allowed: layernorm"),
    (lambda: Training(precision="fp8"), "allowed: fp32, bf16, fp16"),
    (lambda: Training(optimizer="lion"), "allowed: adam, sgd-momentum"),
    (lambda: Parallel(zero=4), "allowed: 0, 1, 2, 3"),
    (lambda: Parallel(offload="cpu"), "needs zero >= 1"),
    (lambda: Parallel(sequence_parallel=True), "needs tp > 1"),
    (lambda: Parallel(recompute="some"), "allowed: none, selective, full"),
    (lambda: Parallel(dp=0), "dp must be >= 1"),
    (lambda: Hardware(peak_flops=1e12, hbm_bytes=1, intra_bw=1, inter_bw=1, target_mfu=1.5), "target_mfu must be in"),
    (lambda: hardware("tpu"), "allowed: a100-40gb"),
    (lambda: model("gpt5"), "allowed: nano"),
    (lambda: Training(micro_batch=2, global_batch=6).accumulation(2), "multiple of micro_batch x dp"),
])
def test_bad_input_is_one_clear_line(make, message):
    with pytest.raises(ValueError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def test_recommendation_follows_the_seed_flow():
    from ringzero.plan.search.recommend import recommend
    small = recommend(model("gpt2"), Training(), A100, 8)
    assert small.parallel == Parallel(dp=8, recompute="selective") and small.steps[0][1] == "yes"
    mid = recommend(model("llama-2-7b"), Training(), A100, 8)         # optimizer-dominated -> ZeRO
    assert mid.parallel.zero == 1 and mid.parallel.dp == 8
    big = recommend(model("llama-2-70b"), Training(), A100, 128)     # 70B on 128 A100s: 3D with ZeRO-1
    assert big.parallel.tp == 8 and big.parallel.zero == 1 and big.parallel.gpus == 128
    assert estimate(model("llama-2-70b"), Training(), big.parallel, A100).fits
    assert [q for q, _, _ in big.steps][:2] == ["Does the model fit on one GPU?", "Is memory mostly optimizer states?"]
    none = recommend(model("gpt3-175b"), Training(), A100, 2)
    assert none.parallel is None and "nothing fits" in none.strategy
