"""The recomputation suite of `ringzero bench train`, on rank 0 alone (the others wait at a barrier).

Three copies of a GPT of the recomputation shape, recompute none / selective / full, trained on one
rank with every core, steps interleaved as in `bench.train_ranks` (`bench.train_job.interleaved`);
`SavedBytes` counts the activation bytes of one more forward each.
"""

from __future__ import annotations

import os
import time

import torch

from ringzero.parallel.recompute import MODES, SavedBytes, apply_recompute
from ringzero.train.data import ByteData, load_bytes
from ringzero.train.model import GPT, AttentionCore
from ringzero.bench.train_job import Job, interleaved


def recompute(job: Job) -> dict:
    shape, b = job.rc_shape, job.rc_batch
    data = ByteData(load_bytes(job.cfg.training.data, job.cfg.training.max_bytes), shape.seq, seed=job.cfg.training.seed)
    variants = {}
    for mode in MODES:
        torch.manual_seed(job.cfg.training.seed)
        model = apply_recompute(GPT(shape), mode, (AttentionCore,))
        variants[mode] = _Single(model, data, b, job.cfg.optim.lr)
    # One rank measures while the others wait in a barrier: it gets every core, as a single
    # training process would.
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        res = interleaved(variants, job.rc_steps, lambda: None)
    finally:
        torch.set_num_threads(threads)
    for mode, v in variants.items():
        res[mode]["activations"] = v.saved_bytes(job.rc_steps)
    return res


class _Single:
    """One rank, no communication: forward, backward, AdamW."""

    def __init__(self, model, data: ByteData, batch: int, lr: float) -> None:
        self.model, self.data, self.batch = model, data, batch
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(self, i: int) -> tuple[float, dict]:
        x, y = self.data.batch("train", i, self.batch)
        t0 = time.perf_counter()
        loss = self.model(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item(), {"forward": t1 - t0, "backward": t2 - t1, "optimizer": time.perf_counter() - t2}

    def saved_bytes(self, i: int) -> int:
        x, y = self.data.batch("train", i, self.batch)
        with SavedBytes(self.model) as saved:
            loss = self.model(x, y)
        loss.backward()
        self.opt.zero_grad(set_to_none=True)
        return saved.total
