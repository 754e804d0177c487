"""`ringzero train`: train ringzero's GPT on `--nproc` ranks and print the plan beside the run.

    ringzero train --nproc 4 --strategy zero2 --precision bf16 --recompute selective --steps 200
    ringzero train --nproc 2 --config ds.json --json-report out/report.json

Everything is checked before a rank starts (config, data path, report path); a bad value is one line
and exit code 2, and nothing is written. Rank 0 shows a progress bar (step, loss, tokens/s, ETA);
the parent prints the validation losses and the predicted-vs-measured table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile

from ..train.config import STRATEGIES, TrainConfig, from_deepspeed

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
FLAGS = ("model", "seq", "attention", "dropout", "strategy", "precision", "recompute", "steps",
         "micro_batch", "grad_accum", "lr", "warmup", "weight_decay", "clip", "bucket_mb",
         "comm_algorithm", "eval_every", "eval_batches", "seed", "data", "max_bytes")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=1, help="local ranks (gloo); ignored under torchrun")
    p.add_argument("--config", help="DeepSpeed-style JSON config (flags given explicitly win)")
    p.add_argument("--json-report", help="write the run and its predicted/measured twins here")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before every rank is stopped")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    for name in FLAGS:
        f = FIELDS[name]
        kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help=f"{(f.metadata or {}).get('help', '')}default: {f.default!r}"
                       + (f"; one of {', '.join(STRATEGIES)}" if name == "strategy" else ""))


def config_from(args: argparse.Namespace, world: int) -> TrainConfig:
    given = {k: getattr(args, k) for k in FLAGS if getattr(args, k) is not None}
    if args.config:
        return from_deepspeed(args.config, world, **given)
    return TrainConfig(**given)


def _check_report_path(path: str | None) -> None:
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"--json-report {path!r}: folder {folder!r} does not exist or is not writable")


def _rank_main(cfg: TrainConfig, show: bool):
    import torch.distributed as dist

    from ..train.engine import train_rank
    progress = None
    if show and (not dist.is_initialized() or dist.get_rank() == 0):
        progress = _Progress(cfg, dist.get_world_size() if dist.is_initialized() else 1)
    try:
        return train_rank(cfg, progress=progress)
    finally:
        if progress:
            progress.close()


class _Progress:
    """Rank 0's bar: step, loss, tokens/s, ETA (rich)."""

    def __init__(self, cfg: TrainConfig, world: int) -> None:
        import time

        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        self.cfg, self.tokens, self.t0, self.time = cfg, cfg.global_batch(world) * cfg.shape.seq, time.perf_counter(), time
        self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                            TextColumn("loss {task.fields[loss]:.3f}  val {task.fields[val]}  "
                                       "{task.fields[rate]:,.0f} tokens/s"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=cfg.steps, loss=math.nan, val="-", rate=0.0)
        self.bar.start()

    def __call__(self, step: int, res) -> None:
        rate = self.tokens * (step + 1) / (self.time.perf_counter() - self.t0)
        val = f"{res.val[-1][1]:.3f}" if res.val else "-"
        self.bar.update(self.task, completed=step + 1, loss=res.losses[-1], val=val, rate=rate)

    def close(self) -> None:
        self.bar.stop()


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .. import launch
    from ..train import report
    from ..train.data import ByteData, load_bytes

    world = int(os.environ["WORLD_SIZE"]) if launch.in_torchrun() else args.nproc
    if world < 1:
        raise ValueError(f"--nproc must be >= 1, got {world}")
    cfg = config_from(args, world)
    if cfg.strategy == "single" and world != 1:
        raise ValueError(f"--strategy single runs on one rank, not --nproc {world}; use dp or zero1-3")
    _check_report_path(args.json_report)
    ByteData(load_bytes(cfg.data, cfg.max_bytes), cfg.shape.seq)       # data path and size, checked now
    results = launch.run(_rank_main, world, args=(cfg, not args.quiet), timeout=args.timeout)
    if launch.in_torchrun():
        if int(os.environ["RANK"]):
            return 0
        results = [results]
    console = Console()
    r0 = results[0]
    console.print(f"validation loss: " + ", ".join(f"step {s}: {v:.3f}" for s, v in r0.val)
                  + f"   (uniform bytes: ln 256 = {math.log(256):.3f})")
    rows = report.twins(cfg, world, results)
    report.render(rows, console)
    if args.json_report:
        _write_json(args.json_report, report.to_json(cfg, world, results, rows))
        console.print(f"wrote {args.json_report}")
    return 0


def _write_json(path: str, data: dict) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
