"""The fp16 loss scaler's settings (Micikevicius et al. 2018 §3.2), with DeepSpeed's meanings.

`parallel.precision.LossScaler` runs them. The scale multiplies the loss before backward, so small
gradients survive fp16's narrow exponent; it is static (`loss_scale` > 0) or dynamic (`loss_scale`
0): it starts at 2**initial_scale_power, doubles after `window` overflow-free steps, and on an
overflow the step is skipped and the scale halves, no lower than `min_scale` -- but only once
`hysteresis` overflows have been seen since the scale last grew (DeepSpeed's "delayed shift": a
lone overflow skips its step without giving up the scale). With `consecutive_hysteresis` every good
step refills the tolerance, so only overflows in a row count. Torch-free: `TrainConfig` checks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass



MAX_POWER = 64
"""The largest initial_scale_power taken: 2**64 already overflows fp16 (max 65504) on any gradient."""


class ScalerError(ValueError):
    """A `LossScalerConfig` field holds a value it cannot take; `.field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, kw_only=True)
class LossScalerConfig:
    loss_scale: float = 0.0
    """0: dynamic scaling; > 0: this static scale, never changed (DeepSpeed's fp16.loss_scale)."""
    initial_scale_power: int = 16
    """The dynamic scale starts at 2**this (torch's GradScaler and DeepSpeed start at 2**16)."""
    window: int = 200
    """Overflow-free steps before the dynamic scale doubles (DeepSpeed's loss_scale_window)."""
    hysteresis: int = 1
    """Overflows tolerated before the scale halves (1: every overflow halves it)."""
    consecutive_hysteresis: bool = False
    """Refill the tolerance after every overflow-free step, not only when the scale grows."""
    min_scale: float = 1.0
    """The dynamic scale's floor (DeepSpeed's min_loss_scale)."""

    def __post_init__(self) -> None:
        checks = (("loss_scale", _real(self.loss_scale) and self.loss_scale >= 0,
                   "must be >= 0 (0: dynamic scaling)"),
                  ("initial_scale_power", _integer(self.initial_scale_power) and 0 <= self.initial_scale_power
                   <= MAX_POWER, f"must be an integer from 0 to {MAX_POWER}"),
                  ("window", _integer(self.window) and self.window >= 1, "must be an integer >= 1"),
                  ("hysteresis", _integer(self.hysteresis) and self.hysteresis >= 1, "must be an integer >= 1"),
                  ("consecutive_hysteresis", isinstance(self.consecutive_hysteresis, bool), "must be true or false"),
                  ("min_scale", _real(self.min_scale) and self.min_scale > 0, "must be > 0"))
        for name, ok, rule in checks:
            if not ok:
                raise ScalerError(name, f"loss_scaler.{name} {rule}, got {getattr(self, name)!r}")
        if self.dynamic and self.min_scale > self.initial_scale:
            raise ScalerError("min_scale", f"loss_scaler.min_scale {self.min_scale:g} is above the initial scale "
                                           f"2**{self.initial_scale_power} = {self.initial_scale:g}")

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == 0

    @property
    def initial_scale(self) -> float:
        return float(self.loss_scale) if not self.dynamic else 2.0 ** self.initial_scale_power


DEEPSPEED = LossScalerConfig(window=1000, hysteresis=2)
"""DeepSpeed's defaults for the keys an fp16 section leaves out (its loss_scale_window is 1000 and
its hysteresis 2; ringzero's own default grows sooner and backs off on the first overflow)."""
