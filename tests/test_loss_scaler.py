"""The fp16 loss scaler (`parallel.precision.LossScaler`) with DeepSpeed's semantics: a dynamic
scale from 2**initial_scale_power that doubles after `window` good steps and halves, no lower than
its floor, once `hysteresis` overflows are spent (every overflow still skips its step), or one
static scale; a checkpoint keeps the overflows still tolerated."""

from __future__ import annotations

from types import SimpleNamespace

from ringzero.parallel.precision import LossScaler
from ringzero.train.checkpointing import _scaler
from ringzero.run.config import TrainConfig
from ringzero.run.precision_options import LossScalerConfig


def _scales(scaler: LossScaler, overflows: str) -> list[float]:
    """The scale after each step of `overflows` ('x': an overflow, '.': a good step)."""
    out = []
    for c in overflows:
        scaler.update(c == "x")
        out.append(scaler.scale)
    return out


def test_loss_scaler_window_hysteresis_floor_and_static():
    s = LossScaler.from_config(LossScalerConfig(initial_scale_power=8, window=2, hysteresis=2, min_scale=64.0))
    # 1st overflow tolerated, 2nd halves, 3rd halves (tolerance spent until the scale grows), the
    # floor holds; two good steps double and refill the tolerance; an overflow restarts the window.
    assert _scales(s, "xxxx..x.x") == [256, 128, 64, 64, 64, 128, 128, 128, 64]
    assert s.skipped == 6
    c = LossScaler.from_config(LossScalerConfig(initial_scale_power=8, window=5, hysteresis=2,
                                                consecutive_hysteresis=True))
    assert _scales(c, "x.x.xx") == [256, 256, 256, 256, 256, 128]   # only overflows in a row count
    static = LossScaler.from_config(LossScalerConfig(loss_scale=128.0, window=1))
    assert _scales(static, "x...x") == [128] * 5 and static.skipped == 2
    default = LossScaler.from_config(TrainConfig().optim.loss_scaler)        # ringzero's own: halve at once
    assert (default.scale, default.window, _scales(default, "x")) == (2.0**16, 200, [2.0**15])


def test_a_checkpoint_keeps_the_overflows_still_tolerated():
    s = LossScaler.from_config(LossScalerConfig(hysteresis=3))
    s.update(True)                                 # one of the three overflows spent, the scale kept
    assert _scaler(SimpleNamespace(scaler=s)) == {"scale": 2.0**16, "good_steps": 0, "skipped": 1, "tolerance": 2}
