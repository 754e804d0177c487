"""How a run updates its weights: AdamW's settings, the learning-rate schedule, gradient clipping,
the training precision and fp16's loss scaler (`precision_options`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ringzero.plan.config import PRECISIONS, value_bytes
from ringzero.run.fields import FieldError, check, choice
from ringzero.run.precision_options import LossScalerConfig


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 3e-3
    warmup: int = 10
    """Linear warm-up steps, then cosine decay to lr/10 at the last step."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    clip: float | None = 1.0
    """Global gradient-norm clipping (None: off)."""
    precision: str = "fp32"
    """fp32, or bf16 / fp16 weights and gradients with fp32 masters (Micikevicius et al. 2018)."""
    loss_scaler: LossScalerConfig = LossScalerConfig()
    """fp16's loss scaling: static or dynamic, its start, window, hysteresis and floor (`precision_options`)."""

    def __post_init__(self) -> None:
        choice(self, "precision", PRECISIONS)
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
        """Linear warm-up then cosine decay to lr/10 at step `steps` (GPT-3's schedule, Brown et al.
        2020 §B)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
