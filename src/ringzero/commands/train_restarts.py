"""`--max-restarts`: when a rank fails, the whole job starts again from the newest complete
checkpoint, as torchrun's elastic agent restarts its workers. Under torchrun its own
`--max-restarts` does the restarting, and the ranks it starts again resume the same way.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ringzero.run.config import TrainConfig


def run(rank_main, cfg: TrainConfig, world: int, args, torchrun: bool, watch) -> list:
    """`rank_main(cfg, quiet, torchrun, checks)` on every rank; when a rank fails and restarts are
    left, run it again from the latest complete checkpoint under --save-dir (from the start if
    there is none yet), without injected faults."""
    from ringzero import launch
    attempt = cfg
    if torchrun and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        attempt = restarted(cfg)                 # torchrun's own --max-restarts started this attempt
    for restart in range(cfg.faults.max_restarts + 1):
        try:
            # The engine keeps its tensors on the CPU, so under torchrun too its collectives run on gloo.
            return launch.run(rank_main, world, args=(attempt, args.quiet, torchrun, args.checks),
                              timeout=args.timeout, watch=watch, backend="gloo")
        except launch.RankError as exc:
            if restart == cfg.faults.max_restarts or torchrun:
                raise
            attempt = restarted(cfg, f"{exc.summary}; restart {restart + 1} of {cfg.faults.max_restarts}")
    raise AssertionError("unreachable")


def torchrun_attempt(cfg: TrainConfig, torchrun: bool) -> TrainConfig:
    """The config this process runs: `cfg`, or under a restart by torchrun's own --max-restarts
    (TORCHELASTIC_RESTART_COUNT > 0) `restarted(cfg)`, what its checks must see too (the save_dir
    then holds the first attempt's checkpoints, which this attempt resumes)."""
    if torchrun and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return restarted(cfg, say=False)
    return cfg


def restarted(cfg: TrainConfig, why: str = "restarted by torchrun", say: bool = True) -> TrainConfig:
    """`cfg` for a restart: from the newest complete checkpoint under --save-dir (the start, or
    --resume, if there is none yet), without the injected faults that made it fail."""
    from ringzero.checkpoint.folders import complete
    done = complete(cfg.checkpoint.save_dir) if cfg.checkpoint.save_dir is not None else []
    start = os.path.join(cfg.checkpoint.save_dir, done[-1]) if done else cfg.checkpoint.resume
    if say and int(os.environ.get("RANK", "0")) == 0:
        print(f"ringzero: {why} from {start or 'the start'}", file=sys.stderr, flush=True)
    return dataclasses.replace(cfg, resume=start, init_from=None if start else cfg.checkpoint.init_from,
                               inject_kill=None, inject_nonfinite=None)
