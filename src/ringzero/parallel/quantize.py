"""Blockwise symmetric int8 / int4 quantization of a tensor and back, for ZeRO++'s quantized weight
all-gather (qwZ) and gradient reduce-scatter (qgZ) (Wang et al. 2023, §3.1, §3.3); its bytes and
error bound are `plan.quantization`'s.

`quantize(x, bits, block)` keeps one fp32 scale per block and an integer code per value (int4 codes
packed two to a byte, the first in the low nibble); `dequantize` returns fp32. A block holding an
inf or NaN dequantizes to NaN everywhere: a gradient that overflowed stays non-finite, so the loss
scaler still sees the overflow, instead of turning into zeros or finite garbage (the collapse to
zero or NaN that DeepSpeed users report from quantized runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..plan.quantization import DEFAULT_BLOCK, blocks, levels


@dataclass(frozen=True)
class Quantized:
    codes: torch.Tensor
    """int8: one code per value (bits 8), or uint8: two per byte (bits 4)."""
    scales: torch.Tensor
    """fp32, one per block (NaN for a block that held a non-finite value)."""
    numel: int
    bits: int
    block: int

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the codes and the scales (`plan.quantization.quantized_bytes`)."""
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()


def _check(bits: int, block: int) -> None:
    levels(bits)
    if not isinstance(block, int) or block < 2 or block % 2:
        raise ValueError(f"block={block!r}; allowed: an even number of values >= 2")


def quantize(x: torch.Tensor, bits: int = 8, block: int = DEFAULT_BLOCK) -> Quantized:
    """`x` (any shape, floating point) as blockwise symmetric `bits`-bit codes and fp32 scales."""
    _check(bits, block)
    flat = x.detach().reshape(-1).float()
    n, q = flat.numel(), levels(bits)
    padded = torch.zeros(blocks(n, block) * block, dtype=torch.float32, device=flat.device)
    padded[:n] = flat
    v = padded.view(-1, block)                                   # (blocks, block)
    absmax = v.abs().amax(dim=1)
    finite = torch.isfinite(absmax)
    # A zero block gets scale 1 (its codes are 0); a non-finite one is coded as zeros under scale NaN.
    divisor = torch.where(finite & (absmax > 0), absmax / q, torch.ones_like(absmax))
    codes = torch.round(torch.where(finite[:, None], v, 0.0) / divisor[:, None]).clamp_(-q, q).to(torch.int8)
    scales = torch.where(finite, absmax / q, torch.full_like(absmax, float("nan")))
    codes = codes.reshape(-1)[:n]
    if bits == 4:                                                # offset to 1..15, two per byte
        u = (codes + 8).to(torch.uint8)
        if n % 2:
            u = torch.cat([u, u.new_full((1,), 8)])
        codes = u[0::2] | (u[1::2] << 4)
    return Quantized(codes=codes, scales=scales, numel=n, bits=bits, block=block)


def dequantize(qt: Quantized) -> torch.Tensor:
    """The fp32 values of `qt`, flat (numel,)."""
    if qt.bits == 4:
        u = torch.stack([qt.codes & 0xF, qt.codes >> 4], dim=1).reshape(-1)[:qt.numel]
        codes = u.to(torch.int16) - 8
    else:
        codes = qt.codes
    scale = qt.scales.repeat_interleave(qt.block)[:qt.numel]
    return codes.float() * scale
