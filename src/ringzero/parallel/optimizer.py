"""Adam on this rank's shard, with fp32 master weights (Rajbhandari et al. 2020 §3.1, §5).

Kingma & Ba (2015): m = β1·m + (1-β1)·g, v = β2·v + (1-β2)·g², w -= lr · m̂ / (sqrt(v̂) + ε) with
m̂ = m/(1-β1^t), v̂ = v/(1-β2^t); AdamW's decoupled decay (Loshchilov & Hutter 2019) multiplies w by
(1 - lr·wd) first. The update is torch's own fused AdamW kernel and the steps around it (average,
clip) follow `torch.optim.AdamW` + `clip_grad_norm_` in order, so a single-process torch run matches
to rounding. With 16-bit weights the optimizer keeps an fp32 master copy of its shard, so 4 (master)
+ 4 (m) + 4 (v) = 12 bytes per parameter live here, divided by the ranks under ZeRO; with fp32
weights the shard itself is the master (8 bytes: m and v).

The optimizer knows nothing of the strategy: it gets the weights it owns (one flat tensor per bucket),
then at each step their gradients, summed over ranks and micro-batches, which `step` divides by
`divisor` (and by the loss scale under fp16), and a function that sums a tensor over the ranks
owning other shards, for the global gradient norm (clipping, the fp16 overflow check).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ringzero.comm import timeline
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import NORM

CHUNK = 1 << 16
"""Elements per chunk when 16-bit gradients are upcast for the fp32 update (256 KiB of fp32)."""


@dataclass(frozen=True, kw_only=True)
class AdamConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip: float | None = None
    """Clip the global gradient norm to this value (None: no clipping)."""

    def __post_init__(self) -> None:
        if not self.lr > 0 or not 0 <= self.betas[0] < 1 or not 0 <= self.betas[1] < 1:
            raise ValueError(f"Adam needs lr > 0 and betas in [0, 1), got lr={self.lr}, betas={self.betas}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")


class ShardedAdam:
    """Adam over `weights` (this rank's flat shards); `sum_over_owners(t)` sums a tensor in place over
    the ranks owning the other shards (None: this rank owns every weight); `counted`: the ranges of
    each gradient this rank adds to the global norm (None: all; tensor parallelism counts a
    replicated parameter on one tp rank only)."""

    def __init__(self, weights: list[torch.Tensor], config: AdamConfig,
                 sum_over_owners: Callable[[torch.Tensor], None] | None = None,
                 counted: list[list[slice]] | None = None) -> None:
        self.config, self.sum_over_owners, self.counted = config, sum_over_owners, counted
        self.shards = weights
        self.mixed = self.shards[0].dtype != torch.float32
        self.t = 0
        self._allocate_state()

    def _allocate_state(self) -> None:
        """The fp32 master (the shard itself with fp32 weights), m and v, beside the shards."""
        self.master = [s.detach().float().clone() if self.mixed else s for s in self.shards]
        self.exp_avg = [torch.zeros_like(w) for w in self.master]
        self.exp_avg_sq = [torch.zeros_like(w) for w in self.master]

    @tagged(NORM)
    def _global_sq_norm(self, grads: list[torch.Tensor]) -> tuple[float, float]:
        """(Σ g² over every rank's shard, seconds in its all-reduce): one all-reduce of one number
        when the shards differ."""
        parts = grads if self.counted is None else [g[s] for g, ss in zip(grads, self.counted) for s in ss]
        local = sum(float(torch.linalg.vector_norm(g, dtype=torch.float32)) ** 2 for g in parts)
        sq = torch.tensor([local], dtype=torch.float32)
        if self.sum_over_owners is None:
            return float(sq), 0.0
        t0 = time.time()
        self.sum_over_owners(sq)
        t1 = time.time()
        timeline.record("comm", "phase", t0, t1, of="grad norm")   # communication inside the optimizer phase
        return float(sq), t1 - t0

    def step(self, grads: list[torch.Tensor], divisor: float, loss_scale: float = 1.0,
             lr: float | None = None) -> dict:
        """Update the shards from their summed gradients `grads`; returns {"grad_norm", "skipped", "comm_s"}
        (the seconds spent in the norm's all-reduce, where the ranks also wait for each other).

        A non-finite norm (an fp16 overflow on any rank) skips the update on every rank. The caller
        then runs the strategy's `after_step` (ZeRO-1/2's all-gather), timed as communication. The
        arithmetic keeps torch's order (average, then clip, then Adam) so the rounding matches a
        single-process `clip_grad_norm_` + `AdamW` run.
        """
        if lr is not None:
            self.config = dataclasses.replace(self.config, lr=lr)
        d = divisor * loss_scale
        if not self.mixed:
            for g in grads:            # fp32: average in place (the summed buffers are spent after this)
                g.div_(d)
        sq, comm_s = self._global_sq_norm(grads)
        norm = math.sqrt(sq) / (d if self.mixed else 1.0)
        if not math.isfinite(norm):
            return {"grad_norm": norm, "skipped": True, "comm_s": comm_s}
        clip = self.config.clip
        coef = clip / (norm + 1e-6) if clip is not None else None
        if coef is not None and coef >= 1.0:       # torch's rule: scale only when it shrinks
            coef = None
        self.t += 1
        self._adam(grads, d if self.mixed else None, coef)
        return {"grad_norm": norm, "skipped": False, "comm_s": comm_s}

    def _kernel_args(self) -> tuple[torch.Tensor, dict]:
        """The step count and keyword arguments of this step's fused AdamW calls."""
        c = self.config
        return torch.tensor(float(self.t)), dict(lr=c.lr, beta1=c.betas[0], beta2=c.betas[1],
                                                 weight_decay=c.weight_decay, eps=c.eps, amsgrad=False,
                                                 maximize=False)

    @torch.no_grad()
    def _adam(self, grads: list[torch.Tensor], divide: float | None, coef: float | None) -> None:
        # torch's fused AdamW kernel over each flat shard: the flat layout is what makes one call per
        # bucket possible. 16-bit gradients are upcast chunk by chunk, so no fp32 copy of a whole
        # bucket is ever alive.
        step, kw = self._kernel_args()
        for shard, w, g, m, v in zip(self.shards, self.master, grads, self.exp_avg, self.exp_avg_sq):
            if not self.mixed:
                adamw_(w, g, m, v, step, kw, None, coef)
                continue
            for lo in range(0, w.numel(), CHUNK):
                part = slice(lo, lo + CHUNK)
                adamw_(w[part], g[part].float(), m[part], v[part], step, kw, divide, coef)
                shard[part].copy_(w[part])

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (master copy when separate, m and v)."""
        ts = self.exp_avg + self.exp_avg_sq + (self.master if self.mixed else [])
        return sum(t.numel() * t.element_size() for t in ts)

    def placement_bytes(self) -> dict[str, int]:
        """Optimizer bytes by location (`plan.strategies.offload.placement`): all beside the weights."""
        return {"device": self.state_bytes(), "host": 0, "disk": 0}

    def io_bytes(self) -> dict[str, int]:
        """Disk bytes read and written by the latest step: none without NVMe offload."""
        return {"read": 0, "write": 0}

    def close(self) -> None:
        """Nothing to release (the offloaded optimizers free buffers and files here)."""


def adamw_(w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: torch.Tensor,
           kw: dict, divide: float | None, coef: float | None) -> None:
    """One fused AdamW call (the arithmetic of `torch.optim.AdamW(fused=True)`, one vectorised pass)
    on fp32 `w`, `m`, `v` of one shape, after dividing the fp32 gradient `g` by `divide` and scaling
    it by the clip coefficient `coef`, in place, in torch's order (average, clip, update). The
    kernel is elementwise, so calls on pieces give the bits of one call on the whole wherever the
    pieces start at multiples of its vector width (`plan.strategies.offload.ALIGN_NUMEL`)."""
    if divide is not None:
        g.div_(divide)
    if coef is not None:
        g.mul_(coef)
    torch._fused_adamw_([w], [g], [m], [v], [], [step], **kw)
