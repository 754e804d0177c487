"""What this machine's ranks can do at once, measured on every rank together (the ranks share the
cores, so each sees its share). They calibrate the step-time prediction of `train.report`.

- FLOP/s: one transformer block of the model's shape, forward and backward on one micro-batch,
  timed; its FLOPs (6 per parameter per token plus the attention matmuls, 12·s·h per token) over
  the time. Small and skinny matmuls, softmax, norms and autograd's own overhead all run well below
  a large matmul's peak on a CPU, so a single big product would overestimate a small model's speed
  by about 2x; the block probe measures the rate this model's layers actually reach.
- Memory bandwidth: an in-place add over 16 MiB of fp32 (the optimizer's element-wise passes
  outside its kernel are memory-bound).
- The AdamW kernel: seconds per parameter of torch's fused AdamW over 1 Mi fp32 parameters, the
  call `ShardedAdam` makes per shard (it computes a square root and a division per element, so
  it runs below the bandwidth an add reaches).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..plan import flops
from ..plan.shapes import ModelShape


def _seconds(fn, seconds: float) -> float:
    fn()                                           # warm-up (allocations, kernel choice)
    t0, reps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds or reps < 2:
        fn()
        reps += 1
    return (time.perf_counter() - t0) / reps


def probe(m: ModelShape, b: int, dtype: torch.dtype, attention: str = "eager", dropout: float = 0.0,
          group=None, seconds: float = 0.3) -> dict:
    """{"flops": FLOP/s one block of shape `m` reaches in forward + backward on a micro-batch of
    `b`, "bandwidth": bytes/s, "adam_s_per_param": seconds} on this rank while every rank of
    `group` probes too."""
    from .model import Block
    if dist.is_initialized():
        dist.barrier(group)
    torch.manual_seed(0)
    block = Block(m, attention, dropout).to(dtype)
    x = torch.randn(b, m.seq, m.hidden).to(dtype).requires_grad_()

    def step():
        block(x).sum().backward()

    work = flops.layer_flops_per_token(m) * b * m.seq
    rate = work / _seconds(step, seconds)
    x, y = torch.zeros(4 * 2**20), torch.ones(4 * 2**20)
    bandwidth = 3.0 * x.numel() * 4 / _seconds(lambda: x.add_(y), seconds / 3)
    w, g, m_, v = (torch.rand(2**20) for _ in range(4))
    step_t = torch.tensor(1.0)

    def adam():
        torch._fused_adamw_([w], [g], [m_], [v], [], [step_t], lr=1e-3, beta1=0.9, beta2=0.999,
                            weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    adam_s = _seconds(adam, seconds / 3) / w.numel()
    return {"flops": rate, "bandwidth": bandwidth, "adam_s_per_param": adam_s}
