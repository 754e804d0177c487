"""What `ringzero bench train` hands its ranks, and how they step it: the `Job` (built and validated
by `bench.train`, run by `bench.train_ranks` and, for recomputation, `bench.recompute_ranks`), the
pipeline schedules compared, and the interleaved stepping every suite is timed by. No torch here:
`bench.train` checks its arguments before any rank, or torch, starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ringzero.plan.model.shapes import ModelShape
from ringzero.run.config import TrainConfig

PP_SCHEDULES = ("gpipe", "1f1b", "interleaved")
"""The schedules of the pipeline comparison (`--pp`), each against torch.distributed.pipelining's."""


def check_steps(steps: int, rc_steps: int, skip: int) -> None:
    """A one-line ValueError naming the step count that leaves no step to time, and its value: each
    suite's median needs a step after the `skip` warm-up ones (and --steps at least 2)."""
    if skip < 0:
        raise ValueError(f"--skip must be >= 0 warm-up steps, got {skip}")
    if steps <= max(1, skip):
        raise ValueError(f"--steps must be at least 2 and more than --skip ({skip}), got {steps}")
    if rc_steps <= skip:
        raise ValueError(f"--rc-steps must be more than --skip ({skip}), got {rc_steps}")


@dataclass(frozen=True)
class Job:
    """What every rank runs (built and validated by `bench.train` before any rank starts)."""

    cfg: TrainConfig
    """Model, micro-batch, optimizer and bucket settings of the dp/zero3 comparisons."""
    suites: tuple[str, ...]
    """"dp", "zero3", "recompute", "compress", "tp", "pp_<schedule>"."""
    rc_shape: ModelShape
    rc_batch: int
    rc_steps: int
    torch_adam: str = "foreach"
    """torch.optim.AdamW implementation of the DDP/FSDP2 peers: "fused" or "foreach" (torch's default)."""
    pp_cfg: TrainConfig | None = None
    """The pipeline comparisons' run (pp = the ranks, its micro-batches and layers; schedule per suite)."""
    compress_cfg: TrainConfig | None = None
    """The compress suite's ringzero run: `cfg` as dp with `--compress`'s scheme (`bench.compress_peer`)."""


def interleaved(variants: dict, steps: int, barrier) -> dict:
    """{name: {"times": [s...], "losses": [...], "phases": [{...}]}}; step i of every variant
    in an order rotated by i, each after a barrier, so drift in the machine's load hits all
    variants alike."""
    names = list(variants)
    out = {n: {"times": [], "losses": [], "phases": []} for n in names}
    for i in range(steps):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            barrier()
            t0 = time.perf_counter()
            loss, ph = variants[n].step(i)
            out[n]["times"].append(time.perf_counter() - t0)
            out[n]["losses"].append(loss)
            out[n]["phases"].append(ph)
    return out
