"""How a run updates its weights: AdamW's settings, the learning-rate schedule, gradient clipping,
the training precision and fp16's loss scaler (`precision_options`).

The schedule is a linear warm-up over `warmup` steps, then `LR_SCHEDULES[lr_schedule]` of the
fraction of the remaining steps that has passed times `lr`: GPT-3's cosine decay to lr/10 (Brown et
al. 2020 §B), or a constant lr (what DeepSpeed runs without a scheduler, and after WarmupLR's
warm-up)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ringzero.plan.config import PRECISIONS, value_bytes
from ringzero.run.fields import FieldError, check, choice
from ringzero.run.precision_options import LossScalerConfig


def _cosine(progress: float) -> float:
    """1 at the end of the warm-up, cosine down to 0.1 at the last step (Brown et al. 2020 §B)."""
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _constant(progress: float) -> float:
    return 1.0


LR_SCHEDULES = {"cosine": _cosine, "constant": _constant}
"""What multiplies lr after the warm-up, by the fraction of the steps after it that have passed."""


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 3e-3
    """AdamW's peak learning rate, reached at the end of the warm-up."""
    warmup: int = 10
    """Linear warm-up steps (0: the full lr from the first step), then `lr_schedule`."""
    lr_schedule: str = "cosine"
    """After the warm-up: cosine decay to lr/10 at the last step, or constant (`LR_SCHEDULES`)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay: each step multiplies the weights by 1 - lr x this (0: none)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's decay rates of the gradient's first and second moments."""
    eps: float = 1e-8
    """Added to the root of AdamW's second moment before the division."""
    clip: float | None = 1.0
    """Clip the gradients' global L2 norm to at most this before the update (None: no clipping)."""
    precision: str = "fp32"
    """fp32, or bf16 / fp16 weights and gradients with fp32 masters (Micikevicius et al. 2018)."""
    loss_scaler: LossScalerConfig = LossScalerConfig()
    """fp16's loss scaling: static or dynamic, its start, window, hysteresis and floor (`precision_options`)."""

    def __post_init__(self) -> None:
        choice(self, "precision", PRECISIONS)
        choice(self, "lr_schedule", tuple(LR_SCHEDULES))
        check(self, "warmup", lambda v: v >= 0, "must be >= 0", integer=True)
        for name in ("lr", "eps"):
            check(self, name, lambda v: math.isfinite(v) and v > 0, "must be > 0")
        check(self, "weight_decay", lambda v: math.isfinite(v) and v >= 0, "must be >= 0")
        check(self, "clip", lambda v: math.isfinite(v) and v > 0, "must be > 0 (or None: off)", optional=True)
        check(self, "betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "must be two numbers in [0, 1)")
        if not isinstance(self.loss_scaler, LossScalerConfig):
            raise FieldError("loss_scaler", f"loss_scaler must be a LossScalerConfig, got {self.loss_scaler!r}")

    @property
    def value_bytes(self) -> int:
        """Bytes of one weight, gradient or activation value in the training precision."""
        return value_bytes(self.precision)

    def lr_at(self, step: int, steps: int) -> float:
        """The lr of step `step` (from 0) of `steps`: linear warm-up, then `lr_schedule`."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, steps - self.warmup)
        return self.lr * LR_SCHEDULES[self.lr_schedule](progress)
