"""Gradient compression as data-parallel communication hooks, as torch DDP's `register_comm_hook`.

A hook reduces one flat gradient bucket over the dp group in place of the strategy's own
collective (`FlatStrategy.register_comm_hook`); what it sends and keeps is
`plan.strategies.compression`, the planner's formulas, and each scheme is one small class:

    cast16.Cast16      fp16 / bf16: the bucket cast to 16 bits and reduced so
    powersgd.PowerSGD  rank-R power iteration with error feedback and warm start (Vogels et al. 2019)
    topk.TopK          the k largest of gradient + residual, all-gathered as (index, value) pairs

`hook.Starting` runs the strategy's plain reduction before a given step (PowerSGD's
start_powerSGD_iter); `hook.Residuals` is the error-feedback state two of them compose, staged so
that a step skipped for an fp16 overflow leaves it as it was.
"""

from __future__ import annotations

from ringzero.plan.strategies.compression import Compression
from ringzero.parallel.compression.cast16 import Cast16
from ringzero.parallel.compression.hook import CommHook, Starting
from ringzero.parallel.compression.powersgd import PowerSGD
from ringzero.parallel.compression.topk import TopK

__all__ = ["Cast16", "CommHook", "PowerSGD", "Starting", "TopK", "hook_for"]


def hook_for(c: Compression, start: int = 0, seed: int = 0) -> CommHook | None:
    """The hook of scheme `c`, plain before step `start` (None: no compression). `seed` draws
    PowerSGD's first Q (the same on every rank)."""
    if not c.on:
        return None
    inner = {"fp16": lambda: Cast16("fp16"), "bf16": lambda: Cast16("bf16"),
             "powersgd": lambda: PowerSGD(c.rank, seed=seed), "topk": lambda: TopK(c.fraction)}[c.scheme]()
    return Starting(inner, start) if start > 0 else inner
