"""Blockwise symmetric int8 / int4 quantization of a tensor and back, for ZeRO++'s quantized weight
all-gather (qwZ) and gradient reduce-scatter (qgZ) (Wang et al. 2023, §3.1, §3.3); its bytes and
error bound are `plan.strategies.quantization`'s.

`quantize(x, bits, block)` keeps one fp32 scale per block and an integer code per value (int4 codes
packed two to a byte, the first in the low nibble); `dequantize` returns fp32. A block holding an
inf or NaN dequantizes to NaN everywhere: a gradient that overflowed stays non-finite, so the loss
scaler still sees the overflow, instead of turning into zeros or finite garbage (the collapse to
zero or NaN that DeepSpeed users report from quantized runs).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ringzero.plan.strategies.quantization import DEFAULT_BLOCK, blocks, levels


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
        """Bytes on the wire: the codes and the scales (`plan.strategies.quantization.quantized_bytes`)."""
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()


def _check(bits: int, block: int) -> None:
    levels(bits)
    if not isinstance(block, int) or block < 2 or block % 2:
        raise ValueError(f"block={block!r}; allowed: an even number of values >= 2")


_SCRATCH = threading.local()


def _scratch(n: int) -> torch.Tensor:
    """This thread's fp32 scratch of `n` values, kept across calls: a fresh multi-MiB tensor costs a
    page fault per 4 KiB on first touch, more than the arithmetic done in it."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < n:
        buf = _SCRATCH.buf = torch.empty(n, dtype=torch.float32)
    return buf[:n]


def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    """`flat` as (blocks, block): a view when it fills whole blocks, else a zero-padded copy."""
    n = flat.numel()
    if n % block == 0:
        return flat.view(-1, block)
    padded = torch.zeros(blocks(n, block) * block, dtype=flat.dtype, device=flat.device)
    padded[:n] = flat
    return padded.view(-1, block)


def quantize(x: torch.Tensor, bits: int = 8, block: int = DEFAULT_BLOCK) -> Quantized:
    """`x` (any shape, floating point) as blockwise symmetric `bits`-bit codes and fp32 scales."""
    _check(bits, block)
    flat = x.detach().reshape(-1)
    n, q = flat.numel(), levels(bits)
    v = _blocks(flat, block)                                     # (blocks, block), x's dtype
    absmax = torch.maximum(v.amax(dim=1), v.amin(dim=1).neg_()).float()   # no |v| tensor to allocate
    finite = torch.isfinite(absmax)
    scales = torch.where(finite, absmax / q, torch.full_like(absmax, float("nan")))
    # A zero block divides by 1 (its codes are 0). A non-finite block's codes are zeroed: its scale
    # (NaN) alone decides what it dequantizes to. Passes over the values: divide, round, cast. No
    # clamp: |v| <= absmax, so |v / (absmax/q)| exceeds q by a rounding error at most, far below the
    # half step that would round past q.
    divisor = torch.where(finite & (absmax > 0), scales, torch.ones_like(absmax))
    codes = torch.div(v, divisor[:, None], out=_scratch(v.numel()).view(v.shape))
    if not bool(finite.all()):
        codes.nan_to_num_(0.0, 0.0, 0.0)
    codes = codes.round_().to(torch.int8).reshape(-1)[:n]
    if bits == 4:                                                # offset to 1..15, two per byte
        u = (codes + 8).to(torch.uint8)
        if n % 2:
            u = torch.cat([u, u.new_full((1,), 8)])
        # Pairs (first, second) read as one little-endian 16-bit word first + 256·second: the byte
        # first | second << 4 without strided passes.
        w = u.view(torch.int16)
        codes = ((w & 0xF) | ((w >> 4) & 0xF0)).to(torch.uint8)
    return Quantized(codes=codes, scales=scales, numel=n, bits=bits, block=block)


def dequantize(qt: Quantized, out: torch.Tensor | None = None, add: bool = False) -> torch.Tensor:
    """The values of `qt`, flat (numel,): a new fp32 tensor, or written into `out` (any floating
    dtype, numel values), or with `add` added to it (one pass: a gradient sum needs no fp32 copy of
    each piece)."""
    if qt.bits == 4:                 # each byte to the word first + 256·second, read as two bytes
        c = qt.codes.to(torch.int16)
        codes = ((c & 0xF) | ((c & 0xF0) << 4)).view(torch.uint8)[:qt.numel].view(torch.int8) - 8
    else:
        codes = qt.codes
    if out is None:
        out = torch.empty(qt.numel, dtype=torch.float32, device=codes.device)
    b, whole = qt.block, qt.numel // qt.block * qt.block        # (blocks, block) x (blocks, 1): no copy of the scales
    dst, c, sc = out[:whole].view(-1, b), codes[:whole].view(-1, b), qt.scales[:whole // b, None]
    if add:
        dst.addcmul_(c, sc)
    else:
        torch.mul(c, sc, out=dst)
    if whole < qt.numel:
        tail = codes[whole:].float() * qt.scales[-1]
        out[whole:] = out[whole:] + tail if add else tail
    return out


def pack(qt: Quantized) -> torch.Tensor:
    """`qt` as one uint8 buffer (codes, then the scales' bytes): what travels in one message."""
    return torch.cat([qt.codes.view(torch.uint8), qt.scales.view(torch.uint8)])


def unpack(buf: torch.Tensor, numel: int, bits: int, block: int = DEFAULT_BLOCK) -> Quantized:
    """The `Quantized` of `numel` values that `pack` wrote into the uint8 buffer `buf`."""
    n_codes = -(-numel * bits // 8)
    codes = buf[:n_codes]
    # A piece of a gathered buffer may start at any byte: the scales (1/64 of int8's bytes) are
    # copied out so that their fp32 view is aligned.
    scales = buf[n_codes:n_codes + 4 * blocks(numel, block)].clone().view(torch.float32)
    return Quantized(codes=codes.view(torch.int8) if bits == 8 else codes, scales=scales,
                     numel=numel, bits=bits, block=block)
