"""Blockwise symmetric quantization (ZeRO++'s qwZ/qgZ building block): its round-trip error bound,
its bytes on the wire against the planner's, zeros, odd sizes, and non-finite values kept visible."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ringzero.parallel.quantize import dequantize, quantize
from ringzero.plan.strategies import quantization as plan


@settings(max_examples=60, deadline=None)
@example(n=1338, bits=8, block=2, scale=107.0, seed=1597)
@given(n=st.integers(1, 2000), bits=st.sampled_from(plan.BITS), block=st.sampled_from([2, 8, 64, 256]),
       scale=st.floats(1e-6, 1e6), seed=st.integers(0, 2**31 - 1))
def test_round_trip_error_is_within_half_a_step_and_bytes_are_the_planners(n, bits, block, scale, seed):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale
    qt = quantize(x, bits, block)
    y = dequantize(qt)
    assert y.shape == (n,) and y.dtype == torch.float32
    pad = (-n) % block
    absmax = torch.cat([x, x.new_zeros(pad)]).view(-1, block).abs().amax(1).repeat_interleave(block)[:n]
    bound = absmax / (2 * plan.levels(bits))
    # Half a step exactly, plus float32's rounding of code * step, which is relative to the block's
    # magnitude and not to the step (x = 51.21 in a block of absmax 113.1 at 8 bits came out 1.5e-6
    # past half a step of 0.445: less than half an ulp of |x|).
    slack = 2 * torch.finfo(torch.float32).eps * absmax
    assert bool(((y - x).abs() <= bound * (1 + 1e-6) + slack + 1e-30).all())
    assert qt.nbytes == plan.quantized_bytes(n, bits, block)
    if bits == 8:                       # no code beyond ±127, though nothing clamps them
        assert int(qt.codes.abs().max()) <= plan.levels(8)


def test_int8_bound_is_max_over_254():
    assert plan.max_error(254.0, 8) == 1.0 and plan.max_error(14.0, 4) == 1.0


def test_a_block_holding_its_maximum_is_exact_there_and_zeros_stay_zero():
    x = torch.tensor([0.0, 0.0, 3.0, -1.5, 0.0, 0.0])
    for bits in plan.BITS:
        y = dequantize(quantize(x, bits, block=2))
        assert y[2] == 3.0 and y[0] == 0.0 and y[4] == 0.0 and y[5] == 0.0


def test_int8_codes_are_one_byte_per_value_and_int4_half():
    x = torch.randn(1000)
    assert quantize(x, 8).codes.numel() == 1000 and quantize(x, 4).codes.numel() == 500
    assert plan.quantized_bytes(1000, 8, 256) == 1000 + 4 * 4
    assert plan.quantized_bytes(1001, 4, 256) == math.ceil(1001 / 2) + 4 * 4


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_values_stay_non_finite_in_their_block_only(bad):
    """An overflowed gradient must not come back as zeros or finite garbage: its block is NaN, so an
    overflow check still fires; the other blocks are untouched."""
    x = torch.ones(8)
    x[5] = bad
    y = dequantize(quantize(x, 8, block=4))
    assert torch.isnan(y[4:]).all() and torch.equal(y[:4], torch.ones(4))


@pytest.mark.parametrize("bits, block, match", [(3, 256, "bits=3"), (8, 3, "block=3"), (8, 0, "block=0")])
def test_bad_settings_are_one_line(bits, block, match):
    with pytest.raises(ValueError, match=match):
        quantize(torch.ones(4), bits, block)
