"""Compute time of one GPU: matrix multiplications at a precision's peak and a shape's efficiency,
and memory-bound work at HBM bandwidth (the roofline, Williams et al. 2009).

A transformer block on one of t tensor-parallel ranks, for a micro-batch of b sequences of s tokens
(T = b·s rows; Shoeybi et al. 2019 §3 split the column and row matrices over t), runs forward:

    QKV        (T, h) @ (h, (h + 2·kv·d)/t)          d = h / heads
    scores     (s, d) @ (d, s)      x b·heads/t      QKᵀ, and (s, s) @ (s, d) for the weighted V
    projection (T, h/t) @ (h/t, h)
    MLP        (T, h) @ (h, f/t) (twice when gated), (T, f/t) @ (f/t, h)

and backward two matmuls per forward one (the gradient of the input, (T, N) @ (N, K), and of the
weight, (K, T) @ (T, N)). A matmul of (M, K) @ (K, N) takes the longer of its arithmetic,
2·M·N·K / (peak x `gemm_efficiency` x wave use), and its memory traffic, the three matrices at
`hbm_bw` x `memory_efficiency` (Williams et al. 2009). Wave use: the output is cut into 256 x 128 tiles, one per SM at a
time, and the last wave runs part-empty (NVIDIA, "Matrix Multiplication Background User's Guide",
wave quantization): a micro-batch of 1 or a wide tp makes small and skinny matmuls.

Memory-bound work streams its bytes at `hbm_bw` x `memory_efficiency`: per token, two norms and two
fused bias-dropout-adds over h (over h/t with sequence parallelism, Korthikanti et al. 2022 §4.2.2),
the activation over f/t, and without fused attention (Dao et al. 2022) the scale-mask-softmax and
dropout of heads/t x s scores (Megatron-LM's fused kernels read and write each element once);
backward reads the saved input and the incoming gradient and writes one gradient, about twice the
forward's bytes. Recomputation (Korthikanti et al. 2022 §5) adds a forward to backward (full) or the
attention core (selective). The optimizer step streams the states of the GPU's shard once.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ringzero.plan.config import value_bytes
from ringzero.plan.hardware import Hardware
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.strategies.tensor_parallel import padded_vocab

TILE = (256, 128)
"""Output tile of cuBLAS's largest Ampere/Hopper kernels (the user's guide's example)."""
BACKWARD_MEMORY = 2.0
"""Backward element-wise bytes per forward byte (input and gradient read, gradient written)."""
MASK_BYTES = 1
"""A dropout mask element (uint8 in PyTorch and Megatron-LM)."""
OPTIMIZER_BYTES = {"adam": 24, "sgd-momentum": 16}
"""fp32 state bytes per parameter the update reads and writes: master weight and two moments (one
for momentum SGD), read and written, 4 bytes each (Rajbhandari et al. 2020 §3.1)."""


@lru_cache(maxsize=65536)
def gemm_seconds(m: int, n: int, k: int, batch: int, flops: float, bw: float, itemsize: int,
                 sms: int, efficiency: float) -> float:
    """Seconds of `batch` matmuls (m, k) @ (k, n) at `flops` peak x `efficiency` x wave use, or at
    `bw` bytes/s when their matrices take longer to stream (see the module doc)."""
    tiles = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1]) * batch
    waves = math.ceil(tiles / sms)
    arithmetic = 2.0 * m * n * k * batch / (flops * efficiency * tiles / (waves * sms))
    traffic = itemsize * (m * k + k * n + m * n) * batch / bw
    return max(arithmetic, traffic)


def layer_gemms(m: ModelShape, b: int, tp: int) -> tuple[tuple[tuple[int, int, int, int], ...], tuple[int, ...]]:
    """One block's forward matmuls on one tp rank as (M, N, K, batch), and the indices of the
    attention core's (QKᵀ and the weighted V: what selective recomputation re-runs)."""
    t_rows, d, heads = b * m.seq, m.head_dim, m.heads // tp
    ups = 2 if m.gated else 1
    gemms = ((t_rows, (m.hidden + 2 * m.kv * d) // tp, m.hidden, 1),      # QKV
             (m.seq, m.seq, d, b * heads),                                 # QKᵀ
             (m.seq, d, m.seq, b * heads),                                 # softmax(QKᵀ) V
             (t_rows, m.hidden, m.hidden // tp, 1),                        # output projection
             (t_rows, m.ffn_dim // tp, m.hidden, ups),                     # MLP up (and gate)
             (t_rows, m.hidden, m.ffn_dim // tp, 1))                       # MLP down
    return gemms, (1, 2)


def _gemm_pair(g: tuple[int, int, int, int], hw: Hardware, flops: float, itemsize: int) -> tuple[float, float]:
    """(forward, backward) seconds of one forward matmul: backward is its two gradient matmuls."""
    mm, n, k, batch = g
    rates = (flops, hw.hbm_bw * hw.memory_efficiency, itemsize, hw.sms, hw.gemm_efficiency)
    # (M, K) @ (K, N) forward; (M, N) @ (N, K) for the input's gradient, (K, M) @ (M, N) the weight's
    return (gemm_seconds(mm, n, k, batch, *rates),
            gemm_seconds(mm, k, n, batch, *rates) + gemm_seconds(k, n, mm, batch, *rates))


def layer_bytes(m: ModelShape, b: int, tp: int, itemsize: int, dropout: bool, sequence_parallel: bool,
                flash_attention: bool) -> tuple[float, float]:
    """Forward bytes of one block's memory-bound work on one tp rank: (outside the attention core,
    the attention core's softmax and dropout)."""
    e, tokens = itemsize, b * m.seq
    width = m.hidden // tp if sequence_parallel else m.hidden
    norms = 2 * 2 * width * e                                          # read x, write y
    bias_dropout_add = 2 * (3 * width * e + (width * MASK_BYTES if dropout else 0))
    activation = (3 if m.gated else 2) * m.ffn_dim // tp * e           # GeLU, or SwiGLU's two in
    rotary = 2 * 2 * (m.hidden + m.kv * m.head_dim) // tp * e if m.positions == "rotary" else 0
    core = 0.0
    if not flash_attention:
        scores = m.heads // tp * m.seq
        core = scores * (2 * e + ((2 * e + MASK_BYTES) if dropout else 0))
    return tokens * (norms + bias_dropout_add + activation + rotary), tokens * core


@lru_cache(maxsize=16384)
def layer_seconds(m: ModelShape, b: int, tp: int, precision: str, recompute: str, dropout: bool,
                  sequence_parallel: bool, flash_attention: bool, hw: Hardware) -> tuple[float, float]:
    """(forward, backward) seconds of one block for a micro-batch of `b` on one tp rank; backward
    includes what `recompute` runs again."""
    itemsize = value_bytes(precision)
    flops, bw = hw.matmul_flops(precision), hw.hbm_bw * hw.memory_efficiency
    gemms, core = layer_gemms(m, b, tp)
    times = [_gemm_pair(g, hw, flops, itemsize) for g in gemms]
    other, attention = (x / bw for x in layer_bytes(m, b, tp, itemsize, dropout, sequence_parallel,
                                                    flash_attention))
    forward = sum(f for f, _ in times) + other + attention
    backward = sum(bk for _, bk in times) + BACKWARD_MEMORY * (other + attention)
    if recompute == "full":
        backward += forward
    elif recompute == "selective":
        backward += sum(times[i][0] for i in core) + attention
    return forward, backward


@lru_cache(maxsize=4096)
def head_seconds(m: ModelShape, b: int, tp: int, precision: str, hw: Hardware) -> tuple[float, float]:
    """(forward, backward) seconds of the output layer: the logits (T, h) @ (h, V/t) and the
    cross-entropy over them (read in 16 bits, softmax kept in fp32 forward and read back)."""
    itemsize = value_bytes(precision)
    vocab = padded_vocab(m.vocab, tp) // tp
    fwd, bwd = _gemm_pair((b * m.seq, vocab, m.hidden, 1), hw, hw.matmul_flops(precision), itemsize)
    loss = b * m.seq * vocab * (itemsize + 4) / (hw.hbm_bw * hw.memory_efficiency)
    return fwd + loss, bwd + loss


def optimizer_seconds(params: int, optimizer: str, hw: Hardware) -> float:
    """One update of `params` parameters on the GPU: the fp32 states read and written, and the
    gradient read (fp32: 4 bytes; mixed precision: the 16-bit gradient read and weight written,
    2 + 2), at HBM bandwidth."""
    return params * (OPTIMIZER_BYTES[optimizer] + 4) / (hw.hbm_bw * hw.memory_efficiency)
