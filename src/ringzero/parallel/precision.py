"""Mixed precision (Micikevicius et al. 2018, "Mixed Precision Training").

fp32 trains in fp32. bf16 and fp16 keep 16-bit weights and gradients (2 + 2 bytes per parameter)
and fp32 master weights and Adam moments in the optimizer (12 bytes). fp16's narrow exponent
underflows small gradients, so the loss is multiplied by a scale before backward and the gradients
divided by it before the update; `LossScaler` grows the scale after `window` overflow-free steps and
halves it (skipping the step on every rank) when any rank sees an inf or NaN, as
`torch.amp.GradScaler` and DeepSpeed's dynamic loss scaler do; as DeepSpeed's, it can wait for
`hysteresis` overflows before halving, or keep one static scale (`run.precision_options`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringzero.plan.config import PRECISIONS

DTYPES = dict(zip(PRECISIONS, (torch.float32, torch.bfloat16, torch.float16)))


def dtype(precision: str) -> torch.dtype:
    if precision not in DTYPES:
        raise ValueError(f"precision={precision!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[precision]


@dataclass
class LossScaler:
    scale: float = 2.0 ** 16
    growth: float = 2.0
    backoff: float = 0.5
    window: int = 200
    min_scale: float = 1.0
    hysteresis: int = 1
    """Overflows tolerated before the scale backs off (DeepSpeed's delayed shift)."""
    consecutive_hysteresis: bool = False
    """Refill the tolerance after every good step (else only when the scale grows)."""
    dynamic: bool = True
    """False: a static scale, never changed (overflowing steps are still skipped)."""
    good_steps: int = 0
    skipped: int = 0
    tolerance: int = 0
    """Overflows still tolerated before the next back-off (`hysteresis` at the start)."""

    def __post_init__(self) -> None:
        self.tolerance = self.tolerance or self.hysteresis

    @classmethod
    def from_config(cls, c) -> "LossScaler":
        """The scaler of a `run.precision_options.LossScalerConfig`."""
        return cls(scale=c.initial_scale, window=c.window, min_scale=c.min_scale, hysteresis=c.hysteresis,
                   consecutive_hysteresis=c.consecutive_hysteresis, dynamic=c.dynamic)

    def update(self, overflow: bool) -> None:
        """After a step: back off on overflow (once the tolerance is spent), grow after `window` good
        steps. An overflow restarts the window, as in DeepSpeed's `DynamicLossScaler.update_scale`."""
        if overflow:
            self.skipped += 1
        if not self.dynamic:
            return
        if overflow:
            if self.tolerance <= 1:
                self.scale = max(self.min_scale, self.scale * self.backoff)
            else:
                self.tolerance -= 1
            self.good_steps = 0
            return
        if self.consecutive_hysteresis:
            self.tolerance = self.hysteresis
        self.good_steps += 1
        if self.good_steps >= self.window:
            self.scale *= self.growth
            self.good_steps = 0
            self.tolerance = self.hysteresis


class NoScaler:
    """fp32 and bf16: no loss scaling."""

    scale = 1.0
    skipped = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.skipped += 1
