"""Blockwise symmetric quantization as ZeRO++ sends weights (qwZ, int8) and gradients (qgZ, int4 or
int8) (Wang et al. 2023, §3.1, §3.3): pure arithmetic of its bytes and its error.

A tensor of n values is cut into blocks of `block` values; each block keeps one fp32 scale,
max|block| / (2^(bits-1) - 1), and each value the nearest integer multiple of it in
[-(2^(bits-1) - 1), 2^(bits-1) - 1] (symmetric: no zero point). On the wire: n·bits/8 bytes of codes
(two 4-bit codes per byte) plus 4 bytes per block; the round trip moves a value by at most half a
step, max|block| / (2·(2^(bits-1) - 1)): max|block| / 254 for int8, / 14 for int4.
"""

from __future__ import annotations

import math

BITS = (4, 8)
DEFAULT_BLOCK = 256
"""Values per scale: the overhead is 4/256 bytes per value (1.6 % of int8), and a block is small
enough that one large value coarsens only its 255 neighbours."""


def levels(bits: int) -> int:
    """The largest code: 127 for int8, 7 for int4."""
    if bits not in BITS:
        raise ValueError(f"bits={bits!r}; allowed: {', '.join(map(str, BITS))}")
    return 2 ** (bits - 1) - 1


def blocks(numel: int, block: int = DEFAULT_BLOCK) -> int:
    return math.ceil(numel / block)


def quantized_bytes(numel: int, bits: int = 8, block: int = DEFAULT_BLOCK) -> int:
    """Bytes of `numel` values quantized to `bits` with one fp32 scale per `block` values."""
    levels(bits)
    return math.ceil(numel * bits / 8) + 4 * blocks(numel, block)


def max_error(absmax: float, bits: int = 8) -> float:
    """The most a value of a block whose largest magnitude is `absmax` moves in a round trip."""
    return absmax / (2 * levels(bits))
