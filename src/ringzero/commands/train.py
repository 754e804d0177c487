"""`ringzero train`: train ringzero's GPT on `--nproc` ranks and print the plan beside the run.

    ringzero train --nproc 4 --strategy zero2 --precision bf16 --recompute selective --steps 200
    ringzero train --nproc 4 --tp 2 --strategy zero1 --sequence-parallel
    ringzero train --nproc 2 --config ds.json --json-report out/report.json
    torchrun --nproc-per-node 2 -m ringzero.cli train --strategy zero1 --steps 50

Everything is checked before a rank starts (config, data path, report path, memory); a bad value
is one line and exit code 2, and nothing is written. Rank 0 shows a progress bar on a terminal and
plain log lines otherwise; a rank that stops completing steps stops the job (`ringzero.watchdog`);
the parent prints the validation losses and the predicted-vs-measured table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

from ..errors import usage
from ..rank_io import in_torchrun
from ..train.config import STRATEGIES, TrainConfig, choices
from ..train.deepspeed import from_deepspeed
from ..watchdog import WatchdogPolicy

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
FLAGS = ("model", "seq", "attention", "dropout", "strategy", "precision", "recompute", "steps",
         "micro_batch", "grad_accum", "lr", "warmup", "weight_decay", "clip", "bucket_mb",
         "comm_algorithm", "eval_every", "eval_batches", "seed", "data", "max_bytes", "log_every", "tp", "dp")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=None,
                   help="local ranks, gloo on loopback (default 1; under torchrun the world is torchrun's)")
    p.add_argument("--config", help="DeepSpeed-style JSON config (flags given explicitly win)")
    p.add_argument("--json-report", metavar="FILE.json",
                   help="write the run and its predicted/measured twins here")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before every rank is stopped")
    policy = WatchdogPolicy()
    p.add_argument("--stall-timeout", type=float, default=policy.floor_s, metavar="S",
                   help=f"stop when the next step does not complete within max(S, {policy.factor:g} x the "
                        f"slowest step so far) seconds; the first step within S (default {policy.floor_s:g})")
    p.add_argument("--force", action="store_true",
                   help="start even if the planner says the ranks do not fit in this machine's memory")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    p.add_argument("--checks", action="store_true",
                   help="verify before every collective that all ranks make the same call (one small "
                        "all-gather each: +12 %% step time on `make run`; also RINGZERO_CHECKS=1 or "
                        "TORCH_DISTRIBUTED_DEBUG=DETAIL)")
    allowed = choices()
    for name in FLAGS:
        f = FIELDS[name]
        kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
        doc = " ".join((f.metadata or {}).get("help", "").split())
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, choices=allowed.get(name),
                       metavar=None if name in allowed else name.upper().replace("_", "-"),
                       help=f"{doc + '; ' if doc else ''}default: {f.default!r}")


    p.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="split LayerNorm and dropout along the sequence over the tp ranks (needs --tp > 1)")


def config_from(args: argparse.Namespace, world: int) -> TrainConfig:
    given = {k: getattr(args, k) for k in FLAGS + ("sequence_parallel",) if getattr(args, k, None) is not None}
    if args.config:
        return from_deepspeed(args.config, world, **given)
    return TrainConfig(**given)


def _world(args: argparse.Namespace, torchrun: bool) -> int:
    if torchrun:
        if args.nproc is not None:
            raise ValueError("--nproc cannot be used under torchrun: torchrun sets the world "
                             "(--nproc-per-node, --nnodes)")
        return int(os.environ["WORLD_SIZE"])
    world = 1 if args.nproc is None else args.nproc
    if world < 1:
        raise ValueError(f"--nproc must be >= 1, got {world}")
    return world


@dataclasses.dataclass(frozen=True)
class Job:
    """What `check` accepted: the run's config, its world and its watchdog."""

    cfg: TrainConfig
    world: int
    watch: WatchdogPolicy


def check(args: argparse.Namespace, torchrun: bool) -> Job:
    """Every check that can fail before a rank starts."""
    from .. import outputs
    from ..comm import config as comm_config
    from ..train import data, footprint

    world = _world(args, torchrun)
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    watch = WatchdogPolicy(floor_s=args.stall_timeout)
    comm_config.CommConfig()                      # reads RINGZERO_CHECKS / TORCH_DISTRIBUTED_DEBUG
    cfg = config_from(args, world)
    cfg.placement(world)                           # tp and dp against the world
    if cfg.strategy == "single" and world != 1:
        raise ValueError(f"--strategy single runs on one rank, not --nproc {world}; use "
                         f"{', '.join(s for s in STRATEGIES if s != 'single')}")
    if args.json_report:
        outputs.check(args.json_report, "--json-report")
    if not torchrun:
        footprint.check(cfg, world, force=args.force)
    data.check(len(data.corpus_bytes(cfg.data, cfg.max_bytes)), cfg.shape.seq)   # path and size, checked now
    return Job(cfg, world, watch)


def _rank_main(cfg: TrainConfig, quiet: bool, torchrun: bool, checks: bool = False):
    import torch.distributed as dist

    from ..comm import config as comm_config
    from ..train.engine import train_rank
    from .train_log import StepCallback
    if checks:
        comm_config.set_config(dataclasses.replace(comm_config.get_config(), checks=True))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    callback = StepCallback(cfg, world, show=not quiet and rank == 0)
    try:
        result = train_rank(cfg, progress=callback)
    finally:
        callback.close()
    if torchrun and world > 1:           # every rank's measurement reaches rank 0, as spawn's do
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        return gathered
    return result


def run(args: argparse.Namespace) -> int:
    torchrun = in_torchrun()
    with usage():
        job = check(args, torchrun)
    cfg, world = job.cfg, job.world
    if not torchrun and not args.quiet:      # said before torch is imported: spawning many ranks is slow
        print(f"ringzero: starting {world} local rank{'s' if world > 1 else ''} (gloo on loopback) for "
              f"{cfg.steps} steps", file=sys.stderr, flush=True)
    from .. import launch
    # The engine keeps its tensors on the CPU, so under torchrun too its collectives run on gloo.
    results = launch.run(_rank_main, world, args=(cfg, args.quiet, torchrun, args.checks),
                         timeout=args.timeout, watch=job.watch, backend="gloo")
    if torchrun:
        if int(os.environ["RANK"]):
            return 0
        results = results if isinstance(results, list) else [results]
    _report(cfg, world, results, args.json_report)
    return 0


def _report(cfg: TrainConfig, world: int, results: list, path: str | None) -> None:
    from rich.console import Console

    from .. import outputs
    from ..train import report
    console = Console()
    console.print("validation loss: " + ", ".join(f"step {s}: {v:.3f}" for s, v in results[0].val)
                  + f"   (uniform bytes: ln 256 = {math.log(256):.3f})")
    rows = report.twins(cfg, world, results)
    probes = report.probe_summary(cfg, world, results)
    report.render(rows, console, probes)
    if path:
        outputs.write_text(path, json.dumps(report.to_json(cfg, world, results, rows, probes), indent=1))
        console.print(f"wrote {path}")
