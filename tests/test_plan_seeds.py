"""The textbook worked examples of distributed-training arithmetic, reproduced by `ringzero.plan`:
GPT-3 175B's parameters, FLOPs, GPUs and memory; LLaMA-7B's data-, tensor- and pipeline-parallel
and ZeRO traffic on 4 and 8 GPUs; a 3D layout of 32 GPUs; a 70B model on 128 A100s; GPT-3's
activations. The sources of the formulas are in docs/references.md.

Where an example's figure is rounded, mixes units or is inconsistent, the test pins the correct value
and says why. "MB" in the LLaMA-7B tensor/pipeline examples are MiB: 8 x 4 x 2048 x 4096 x 2 B =
2^29 B = 512 MiB (536.9 MB).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ringzero.plan.model import activations as act
from ringzero.plan.model import flops
from ringzero.plan.comm.volume import call_for, volume
from ringzero.plan.config import Parallel, Training
from ringzero.plan.strategies.memory import model_states, state_bytes, zero_formula
from ringzero.plan.model.presets import model
from ringzero.plan.model.shapes import approx_params, param_count
from ringzero.plan.step_time import transfer_seconds
from ringzero.plan.strategies.traffic import (data_parallel_ops, pipeline_ops, seed_dp_bytes, seed_pp_bytes,
                                         seed_tp_bytes_per_layer, tensor_parallel_ops)

GB, MiB, GiB = 1e9, 2**20, 2**30
MIXED_ADAM = state_bytes("bf16", "adam")
LLAMA7 = model("llama-2-7b")


# --- GPT-3 175B: parameters, FLOPs, GPUs (Kaplan et al. 2020; Brown et al. 2020) -------------------

def test_gpt3_params_approximation_and_exact_count():
    # 96 x (12 x 12288^2 + 5 x 12288) ≈ 1.74e11 ("exactly 175 billion", as the example puts it).
    assert approx_params(96, 12288) == pytest.approx(1.74e11, rel=5e-3)
    # The exact count (biases, LayerNorms, 50257-token embedding, 2048 positions): 174.6e9.
    assert param_count(model("gpt3-175b")).total == 174_604_259_328


def test_gpt3_training_flops():
    # 6 x 1.75e11 x 3e11 is 3.15e23; the quoted 3.14e23 is 6ND with the exact 174.6e9 parameters.
    assert flops.training_flops(175e9, 300e9) == pytest.approx(3.15e23)
    assert flops.training_flops(param_count(model("gpt3-175b")).total, 300e9) == pytest.approx(3.14e23, rel=2e-3)
    assert flops.training_flops(175e9, 300e9, recompute="full") == pytest.approx(8 * 175e9 * 300e9)


def test_a100s_for_30_days_at_half_mfu():
    total = 3.14e23
    assert flops.sustained_flops(total, 30) == pytest.approx(1.2e17, rel=0.01)          # "≈ 1.2e17 FLOP/s"
    assert flops.sustained_flops(total, 30) / 0.5 == pytest.approx(2.4e17, rel=0.01)    # peak needed
    # "175B in 30 days needs at least several hundred A100s": 2.42e17 / 3.12e14 = 776.5 -> 777 A100s.
    assert flops.gpus_needed(total, 30, 3.12e14, 0.5) == 777
    assert flops.training_days(total, 777, 3.12e14, 0.5) <= 30 < flops.training_days(total, 776, 3.12e14, 0.5)


# --- GPT-3 175B: the memory wall (Rajbhandari et al. 2020 §3.1) ---------------------------------------

def test_gpt3_static_memory():
    params, grads, optimizer, _ = model_states(175_000_000_000, MIXED_ADAM)
    assert params + grads == 700 * GB            # 175e9 x 2 B x 2
    assert optimizer == 2.1e12                   # 175e9 x 12 B
    assert params + grads + optimizer == 2.8e12  # "> 2.8 TB"


def test_gpus_of_80gb_to_hold_gpt3_states():
    # 2800 GB / 80 GB = 35: the fewest ZeRO-3 shards that fit model states in 80 GB.
    n = next(n for n in range(1, 100) if zero_formula(175e9, n, 3) <= 80 * GB)
    assert n == 35


def test_gradient_sync_time_infiniband_vs_nvlink():
    grads = 175e9 * 2                                                    # 350 GB of fp16 gradients
    assert transfer_seconds(grads, 50e9) == pytest.approx(7.0)           # InfiniBand ~50 GB/s
    assert transfer_seconds(grads, 1.8e12) == pytest.approx(0.194, abs=1e-3)   # NVLink ~1.8 TB/s: "≈ 0.2 s"


# --- LLaMA-7B: data parallel (Patarasuk & Yuan 2009; Li et al. 2014) ---------------------------------

def test_llama7b_naive_vs_ring_on_4_gpus():
    phi = 7e9 * 2                                       # bytes of fp16 gradients
    assert seed_dp_bytes(4, phi, "naive") == 112 * GB   # the example's 2·N·Φ, a system total
    assert seed_dp_bytes(4, phi, "ring") == 21 * GB     # per GPU
    ring = [volume(call_for("all_reduce", "ring", 4, 7_000_000_000, 2), r) for r in range(4)]
    assert all(v.bytes_sent == v.bytes_recv == 21 * GB for v in ring)
    naive = [volume(call_for("all_reduce", "naive", 4, 7_000_000_000, 2), r) for r in range(4)]
    # Exactly: the root receives and sends (N-1)·Φ = 42 GB; each worker Φ each way; the system
    # sends 2(N-1)·Φ = 84 GB, which the example rounds up to 2·N·Φ = 112 GB.
    assert naive[0].bytes_sent == naive[0].bytes_recv == 42 * GB
    assert all(v.bytes_sent == v.bytes_recv == 14 * GB for v in naive[1:])
    assert sum(v.bytes_sent for v in naive) == sum(v.bytes_sent for v in ring) == 84 * GB


def test_ring_time_formula_q11():
    # T_ring = 2(N-1)(α + Φ/(N·B)): every one of the 2(N-1) steps pays α and moves Φ/N.
    from ringzero.plan.hardware import hardware
    from ringzero.plan.step_time import op_seconds
    hw = hardware("a100-80gb")
    tr, par = Training(), Parallel(dp=8)
    (op,) = data_parallel_ops(LLAMA7, tr, par, hw.gpus_per_node, "ring")
    phi = op.count * op.itemsize
    expected = 2 * 7 * (hw.intra_alpha + phi / 8 / hw.intra_bw)
    assert op_seconds(op, hw) == pytest.approx(expected, rel=1e-6)


# --- LLaMA-7B: tensor parallel (Shoeybi et al. 2019; Narayanan et al. 2021 §3.2) ---------------------

def test_tensor_parallel_bytes_per_ffn_and_layer():
    b, s, h = 4, 2048, 4096
    assert seed_tp_bytes_per_layer(b, s, h) / 2 == 256 * MiB     # FFN: 2 all-reduces of 2bsh
    assert seed_tp_bytes_per_layer(b, s, h) == 512 * MiB         # layer: 8bsh
    assert 32 * seed_tp_bytes_per_layer(b, s, h) == 16 * GiB     # "16 GB of tensor-parallel traffic in all"
    # Exactly, a ring all-reduce over t ranks sends 2(t-1)/t·bsh: at t = 2 half the large-t limit.
    m = replace(LLAMA7, seq=s)
    (op,) = tensor_parallel_ops(m, Training(micro_batch=b), Parallel(tp=2), 8)
    per_layer = op.bytes_sent / m.layers
    assert per_layer == 256 * MiB == seed_tp_bytes_per_layer(b, s, h) * (2 - 1) / 2
    (op8,) = tensor_parallel_ops(m, Training(micro_batch=b), Parallel(tp=8), 8)
    assert op8.bytes_sent / m.layers == 512 * MiB * 7 / 8


# --- LLaMA-7B: pipeline parallel (Narayanan et al. 2021 §3.2; GPipe, Huang et al. 2019) --------------

def test_pipeline_bytes_on_four_stages():
    b, s, h = 4, 2048, 4096
    assert seed_pp_bytes(4, b, s, h) == 384 * MiB               # 2 x 3 x 64 MiB
    m = replace(LLAMA7, seq=s)
    (op,) = pipeline_ops(m, Training(micro_batch=b), Parallel(pp=4), 8)
    # A middle stage sends one activation forward and one gradient back: 2 x 64 MiB; the three
    # boundaries carry the example's 384 MiB together.
    assert op.bytes_sent == 128 * MiB
    assert 3 * 2 * b * s * h * 2 == seed_pp_bytes(4, b, s, h)


def test_pipeline_bubble():
    from ringzero.plan.hardware import hardware
    from ringzero.plan.step_time import step_time
    t = step_time(LLAMA7, Training(micro_batch=1, global_batch=8), Parallel(pp=4), hardware("h100-sxm"))
    assert t.bubble_fraction == pytest.approx(3 / 11)                  # (p-1)/(m+p-1)
    assert t.bubble == pytest.approx(t.compute * 3 / 8)


# --- LLaMA-7B and 70B: ZeRO (Rajbhandari et al. 2020 §5, §7) ------------------------------------------

def test_zero_traffic_llama7b_on_8_gpus():
    phi = 7e9 * 2
    assert 2 * phi == 28 * GB and 3 * phi == 42 * GB               # the textbook 2Φ and 3Φ
    # Exactly, each ring phase sends (N-1)/N·Φ: 24.5 GB and 36.75 GB on 8 GPUs.
    rs = volume(call_for("reduce_scatter", "ring", 8, 7_000_000_000, 2), 0).bytes_sent
    ag = volume(call_for("all_gather", "ring", 8, 7_000_000_000, 2), 0).bytes_sent
    assert rs + ag == 24.5 * GB and rs + 2 * ag == 36.75 * GB
    one = sum(o.bytes_sent for o in data_parallel_ops(LLAMA7, Training(), Parallel(dp=8, zero=1), 8))
    three = sum(o.bytes_sent for o in data_parallel_ops(LLAMA7, Training(), Parallel(dp=8, zero=3), 8))
    assert three / one == 1.5                                          # "+50 %"


def test_zero_memory_formulas():
    psi, n = 7e9, 8
    assert zero_formula(psi, 1, 0) == 112 * GB                         # 16Ψ
    assert zero_formula(psi, n, 3) == 14 * GB                          # 16Ψ/N
    assert zero_formula(psi, n, 1) == 4 * psi + 12 * psi / n
    assert zero_formula(psi, n, 2) == 2 * psi + 14 * psi / n
    for stage in range(4):
        assert sum(model_states(7_000_000_000, MIXED_ADAM, dp=n, zero=stage)) == zero_formula(psi, n, stage)


def test_q6_optimizer_share_on_1024_gpus():
    # The example of a 1024-GPU cluster: 12Φ/1024 ≈ 0.012Φ; with dp x tp x pp = 1024 the optimizer
    # is a sliver of each GPU's memory next to the 2Φ/(tp·pp) of weights and of gradients.
    p, g, o, _ = model_states(70_000_000_000, MIXED_ADAM, dp=64, zero=1, tp=8, pp=2)
    assert o == pytest.approx(12 * 70e9 / 1024, abs=12)
    assert p == g == pytest.approx(2 * 70e9 / 16, abs=2)


def test_q15_70b_on_128_a100s():
    # The worked example of a 70B model on 128 A100-80GB: TP = 8, PP = 2, DP = 8 with ZeRO-1.
    b, s, h = 8, 4096, 8192
    # TP = 8 inside the node: 8·b·s·h x 2 B per layer = 4 GiB for b = 8 ("≈ 4 GB per layer").
    assert seed_tp_bytes_per_layer(b, s, h) == 4 * GiB
    # PP = 2: 2·(p-1)·b·s·h x 2 B is 1 GiB at the same b = 8; the example's "≈ 0.5 GB" needs b = 4,
    # i.e. its TP and PP lines use different batch sizes.
    assert seed_pp_bytes(2, b, s, h) == 1 * GiB
    assert seed_pp_bytes(2, 4, s, h) == 0.5 * GiB
    # DP = 8: 2Φ/(tp·pp) = 2 x 70e9 x 2 B / 16 = 17.5 GB (the ring's exact 7/8 of it: 15.3 GB).
    assert 2 * 70e9 * 2 / (8 * 2) == 17.5 * GB
    count = 70_000_000_000 // 16
    assert volume(call_for("all_reduce", "ring", 8, count, 2), 0).bytes_sent == 2 * 7 / 8 * count * 2
    # Its memory, as in the 1024-GPU example: 2Φ/16 + 2Φ/16 + 12Φ/128 = 8.75 + 8.75 + 6.5625 GB:
    # ZeRO-1 fits in 80 GB.
    assert sum(model_states(70_000_000_000, MIXED_ADAM, dp=8, zero=1, tp=8, pp=2)) == pytest.approx(24.0625 * GB)


# --- GPT-3 175B: activations (Korthikanti et al. 2022 §4) ---------------------------------------------

def test_korthikanti_per_layer_formula():
    m = model("gpt3-175b")
    for b, s in ((1, 2048), (4, 1024), (3, 7)):
        assert act.layer_bytes(m, b, s) == act.korthikanti(b, s, m.hidden, m.heads)
    t = 8   # Korthikanti eq. 2 (TP) and 3 (TP + SP), eq. 4 (selective with SP)
    sbh = 2048 * 12288
    assert act.layer_bytes(m, 1, 2048, tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * 96 * 2048 / (12288 * t)))
    assert act.layer_bytes(m, 1, 2048, tp=t, sp=True) == pytest.approx(sbh / t * (34 + 5 * 96 * 2048 / 12288))
    assert act.layer_bytes(m, 1, 2048, tp=t, sp=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert act.layer_bytes(m, 1, 2048, recompute="full") == 2 * sbh


def test_gpt3_activations_example():
    # b·s = 3.2M tokens, s = 2048 -> b ≈ 1563; h = 12288, a = 96, L = 96. One sequence already
    # holds 96 x (34sbh + 5as²b) = 275 GB ("hundreds of GB"); the whole 1563-sequence batch ~430 TB,
    # far beyond the example's "approaching a TB": nobody holds a whole batch on one GPU, hence
    # micro-batches.
    one = 96 * act.korthikanti(1, 2048, 12288, 96)
    assert one == pytest.approx(275e9, rel=0.01)
    assert 96 * act.korthikanti(1563, 2048, 12288, 96) == pytest.approx(430e12, rel=0.01)
    assert math.isclose(3.2e6 / 2048, 1562.5)


def test_3d_example_32_gpus():
    # The 3D example on 32 GPUs: DP = 2, TP = 4, PP = 4. C_DP = 2Φ/(tp·pp) in the large-N limit; with two
    # data-parallel ranks the ring sends exactly half of it, 2(N-1)/N = 1.
    from ringzero.plan.estimate import estimate
    from ringzero.plan.hardware import hardware
    m = replace(LLAMA7, seq=2048)
    e = estimate(m, Training(micro_batch=4), Parallel(dp=2, tp=4, pp=4), hardware("a100-80gb"))
    local = math.ceil(param_count(m).total / 16)
    assert e.comm_bytes("dp") == 2 * (2 - 1) / 2 * local * 2
    # 8 layers per stage, and the all-gather of each 1/t slice a stage receives (the scatter/gather)
    assert e.comm_bytes("tp") == 4 * 2 * 3 / 4 * 4 * 2048 * 4096 * 2 * (32 // 4) + 2 * 3 / 4 * 4 * 2048 * 4096 * 2
    # A middle stage's tp rank sends its 1/t slice of each activation and gradient (Narayanan et al.
    # 2021 §4.1's scatter/gather).
    assert e.comm_bytes("pp") == 2 * 4 * 2048 * 4096 * 2 // 4
    links = {o.kind: ("network" if o.spans_nodes else "nvlink") for o in e.ops}
    # tp=4 ranks are neighbours (NVLink); dp strides by 4 and still fits a node of 8; pp crosses nodes.
    assert links == {"dp": "nvlink", "tp": "nvlink", "pp": "network"}
