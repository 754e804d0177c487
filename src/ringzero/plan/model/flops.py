"""Training compute: FLOPs, days and GPUs (Kaplan et al. 2020 §2.1; MFU, Chowdhery et al. 2022).

    FLOPs ≈ 6·N·D

2 FLOPs per parameter per token forward (one multiply, one add) and 4 backward (gradients with
respect to activations and to weights). Full activation recomputation runs the forward twice,
8·N·D (Korthikanti et al. 2022, §5). Selective recomputation re-runs only the attention core:
QKᵀ and the attention-weighted sum of V, 2·2·s·h FLOPs per token per layer (Korthikanti et al.,
§4.2 cost this at a few percent). The model FLOPs (what MFU counts) stay 6·N·D in every case.

These are counts. Planning figures divide them by a target MFU (`training_days`, `gpus_needed`, with
`Hardware.target_mfu`); the step time does not: `plan.model.compute` times the same matmuls one by one
(the attention matmuls, `attention_flops_per_token`, included) and the memory-bound work beside them.
"""

from __future__ import annotations

import math

from ringzero.plan.model.shapes import ModelShape

SECONDS_PER_DAY = 86_400


def model_flops_per_token(n_params: int) -> float:
    """6N: the FLOPs MFU counts, whatever is recomputed."""
    return 6.0 * n_params


def hardware_flops_per_token(n_params: int, recompute: str = "none", model: ModelShape | None = None) -> float:
    """FLOPs the GPUs execute per token: 6N, 8N with full recomputation, 6N + 4·L·s·h selective."""
    if recompute == "full":
        return 8.0 * n_params
    if recompute == "selective":
        if model is None:
            raise ValueError("selective recomputation FLOPs need the model shape")
        return 6.0 * n_params + 4.0 * model.layers * model.seq * model.hidden
    return 6.0 * n_params


def attention_flops_per_token(m: ModelShape) -> float:
    """The attention matmuls 6N leaves out: QKᵀ and the weighted sum of V, 2·2·s·h FLOPs per token
    per layer forward, x3 with backward: 12·L·s·h (Chowdhery et al. 2022, PaLM, Appendix B)."""
    return 12.0 * m.layers * m.seq * m.hidden


def step_flops_per_token(n_params: int, recompute: str, model: ModelShape) -> float:
    """FLOPs a training step executes per token: `hardware_flops_per_token` plus the attention
    matmuls it leaves out (`attention_flops_per_token`)."""
    return hardware_flops_per_token(n_params, recompute, model) + attention_flops_per_token(model)


def layer_flops_per_token(m: ModelShape, recompute: str = "none") -> float:
    """One block's forward + backward FLOPs per token (`step_flops_per_token` of a one-layer model
    without its embeddings: 6 per parameter of the block plus its attention matmuls)."""
    import dataclasses

    from ringzero.plan.model.shapes import param_count
    one = dataclasses.replace(m, layers=1)
    return step_flops_per_token(param_count(one).per_layer, recompute, one)


def training_flops(n_params: int, tokens: float, recompute: str = "none", model: ModelShape | None = None) -> float:
    """Total FLOPs to train on `tokens` tokens (GPT-3 175B on 300B tokens: 6 x 1.75e11 x 3e11 ≈ 3.15e23;
    Brown et al. 2020, Table D.1, give 3.14e23)."""
    return hardware_flops_per_token(n_params, recompute, model) * tokens


def sustained_flops(total_flops: float, days: float) -> float:
    """FLOP/s needed to finish in `days` (GPT-3's 3.14e23 in 30 days ≈ 1.2e17 FLOP/s)."""
    return total_flops / (days * SECONDS_PER_DAY)


def training_days(total_flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """Days on `gpus` GPUs of `peak_flops` each running at `mfu` (a target: FLOPs counted as MFU
    counts them, 6·N·D, for a target MFU)."""
    return total_flops / (gpus * peak_flops * mfu) / SECONDS_PER_DAY


def gpus_needed(total_flops: float, days: float, peak_flops: float, mfu: float) -> int:
    """GPUs to finish in `days` at `mfu` (GPT-3 175B in 30 days on A100s at 50 % MFU: 777)."""
    return math.ceil(sustained_flops(total_flops, days) / (peak_flops * mfu))
