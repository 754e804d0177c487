"""An injected straggler (`TrainConfig.straggler`): one rank computes `factor` times as long."""

from __future__ import annotations

import time

from ringzero.comm import timeline
from ringzero.run.config import TrainConfig


def straggle(cfg: TrainConfig, rank: int, compute_s: float) -> float:
    """The injected straggler (`cfg.faults.straggler` = (rank, factor)): on that rank, sleep (factor - 1)
    times the step's compute so that it takes factor times as long, without using a core (other
    ranks share them). Returns the seconds slept."""
    if cfg.faults.straggler is None or cfg.faults.straggler[0] != rank:
        return 0.0
    extra = (cfg.faults.straggler[1] - 1.0) * compute_s
    t0 = time.time()
    time.sleep(extra)
    timeline.record("straggler", "phase", t0, t0 + extra, factor=cfg.faults.straggler[1])
    return extra
