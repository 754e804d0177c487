"""The step-time model against published runs, and the compute model's parts one by one."""

from __future__ import annotations

import dataclasses

import pytest

from ringzero.plan.model import flops
from ringzero.plan.model.compute import layer_seconds
from ringzero.plan.config import Parallel, Training
from ringzero.plan.estimate import estimate
from ringzero.plan.hardware import hardware
from ringzero.plan.model.presets import model
from ringzero.plan.published import CASES, fidelity, summary
from ringzero.plan.model.shapes import param_count
from ringzero.plan.step_time import compute_seconds, stage_seconds, step_time

A100 = hardware("a100-80gb")
LLAMA7 = model("llama-2-7b")


def test_published_throughputs_within_bounds():
    """Narayanan et al. 2021 Table 1 and BLOOM-176B on the a100-80gb defaults, no per-case tuning:
    mean absolute error <= 10 %, none worse than 20 %."""
    rows = fidelity(A100)
    assert len([r for r in rows if r.case.checked]) >= 11
    mean, worst = summary(rows)
    assert mean <= 0.10 and worst <= 0.20, [(r.case.name, round(r.error, 3)) for r in rows]


def test_every_case_names_its_source_and_runs_as_published():
    for c in CASES:
        assert c.source and c.parallel.gpus * c.tflops > 0
        c.training.accumulation(c.parallel.dp)        # the global batch divides as the run did


def test_target_mfu_is_only_the_planning_figure():
    """Days at the target MFU are 6·N·D / (GPUs x peak x target); the step time ignores the target."""
    tr, par = Training(micro_batch=1, global_batch=64, tokens=2e12), Parallel(dp=8, tp=2, pp=4)
    e = estimate(LLAMA7, tr, par, A100)
    n = param_count(LLAMA7).total
    assert e.days_at_target_mfu == pytest.approx(6 * n * 2e12 / (64 * 312e12 * 0.5) / 86400)
    low = dataclasses.replace(A100, target_mfu=0.25)
    assert step_time(LLAMA7, tr, par, low) == e.time
    assert estimate(LLAMA7, tr, par, low).days_at_target_mfu == pytest.approx(2 * e.days_at_target_mfu)
    assert not hasattr(A100, "mfu")


def _per_sequence(mb: int, tp: int = 1) -> float:
    tr, par = Training(micro_batch=mb, global_batch=8 * mb), Parallel(tp=tp)
    fwd, bwd = compute_seconds(LLAMA7, tr, par, A100)
    return (fwd + bwd) / tr.global_batch


def test_micro_batch_and_tp_change_the_matmul_shapes_and_the_time():
    """Larger micro-batches make taller matmuls that run nearer peak: a sequence costs less."""
    assert _per_sequence(4) < _per_sequence(1)
    # tp = 8 makes the matmuls 8 times narrower: more than 1/8 of the time each
    assert _per_sequence(1, tp=8) > _per_sequence(1) / 8


def test_fp32_is_timed_at_the_fp32_peak():
    tr = Training(micro_batch=1, global_batch=1)
    bf16 = sum(compute_seconds(LLAMA7, tr, Parallel(), A100))
    fp32 = sum(compute_seconds(LLAMA7, dataclasses.replace(tr, precision="fp32"), Parallel(), A100))
    tf32 = sum(compute_seconds(LLAMA7, dataclasses.replace(tr, precision="fp32"), Parallel(),
                               dataclasses.replace(A100, fp32_tensor_cores=True)))
    assert fp32 > 8 * bf16                      # 312 / 19.5 = 16 on the matmuls
    assert bf16 < tf32 < fp32


def test_attention_matmuls_are_in_the_time():
    """At s = 4096 the attention matmuls (12·s·h per token per layer) are a fifth of llama-2-7b's
    FLOPs: a layer's time per token grows with s at the same rows per matmul (b·s = 4096), and
    covers them at the sustained matmul rate."""
    short = dataclasses.replace(LLAMA7, seq=1024)
    per_token = lambda m, b=1: sum(layer_seconds(m, b, 1, "bf16", "none", True, False, True, A100)) / (b * m.seq)  # noqa: E731
    assert per_token(LLAMA7) > 1.05 * per_token(short, 4)
    layer = flops.layer_flops_per_token(LLAMA7)        # 6 x block parameters + 12·s·h
    assert per_token(LLAMA7) * A100.peak_flops * A100.gemm_efficiency >= layer


def test_recomputation_re_runs_what_it_recomputes():
    t = {r: sum(layer_seconds(LLAMA7, 1, 1, "bf16", r, True, False, False, A100))
         for r in ("none", "selective", "full")}
    assert t["none"] < t["selective"] < t["full"]
    fwd = layer_seconds(LLAMA7, 1, 1, "bf16", "none", True, False, False, A100)[0]
    assert t["full"] == pytest.approx(t["none"] + fwd)


def test_uneven_pipeline_is_timed_on_its_busiest_stage():
    """32 layers on 7 stages (4, 4, 5, 5, 5, 5 and 4 with the head): the time is a 5-layer stage's,
    not 32/7 layers' as total / GPUs would have it."""
    lf, lb = layer_seconds(LLAMA7, 1, 1, "bf16", "none", True, False, False, A100)
    fwd, bwd = stage_seconds(LLAMA7, 1, 1, 7, 1, "bf16", "none", True, False, False, A100)
    assert fwd + bwd == pytest.approx(5 * (lf + lb)) and 5 > 32 / 7 * 1.05
    tr = Training(micro_batch=1, global_batch=14, dropout=True)
    assert sum(compute_seconds(LLAMA7, tr, Parallel(pp=7), A100)) == pytest.approx(14 * 5 * (lf + lb))


def test_the_timed_matmuls_are_the_counted_flops():
    """`plan.model.compute`'s forward matmuls of one block, x3 with backward, are `flops.layer_flops_per_token`
    (6 per weight plus the attention matmuls) up to the biases and norms the count also holds."""
    from ringzero.plan.model.compute import layer_gemms
    for m in (LLAMA7, model("gpt3-175b"), model("llama-2-70b")):
        gemms, _ = layer_gemms(m, 1, 1)
        timed = 3 * sum(2 * mm * n * k * batch for mm, n, k, batch in gemms) / m.seq
        assert timed == pytest.approx(flops.layer_flops_per_token(m), rel=1e-3)
