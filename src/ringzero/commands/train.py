"""`ringzero train`: train ringzero's GPT on `--nproc` ranks and print the plan beside the run.

    ringzero train --nproc 4 --strategy zero2 --precision bf16 --recompute selective --steps 200
    ringzero train --nproc 4 --tp 2 --strategy zero1 --sequence-parallel
    ringzero train --nproc 4 --pp 2 --tp 2 --grad-accum 8 --schedule interleaved --virtual-stages 2 \
        --layers 8 --pipeline-plot schedule.png
    ringzero train --nproc 8 --layout auto
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
import os
import re
import sys

from ringzero.errors import usage
from ringzero.plan.units import BandwidthFlag
from ringzero.rank_io import in_torchrun
from ringzero.run.config import SECTIONS, STRATEGIES, TrainConfig, choices, flat_fields
from ringzero.run.fields import docs
from ringzero.run.deepspeed.reader import from_deepspeed
from ringzero.run.kind import RunKind
from ringzero.watchdog import WatchdogPolicy
from ringzero.commands import train_args, train_log, train_notes, train_outputs, train_restarts
from ringzero.commands.train_layout import auto_layout, layout_why

FIELDS = {name: f for name, (_, f) in flat_fields().items()}
HELP = {name: docs(SECTIONS[section]).get(f.name, "") for name, (section, f) in flat_fields().items()}
"""Each field's docstring, written once under the field: its flag's help."""
FLAGS = ("model", "seq", "attention", "dropout", "strategy", "precision", "recompute", "steps",
         "micro_batch", "grad_accum", "lr", "warmup", "lr_schedule", "weight_decay", "clip", "bucket_mb",
         "comm_algorithm", "transport", "eval_every", "eval_batches", "seed", "data", "max_bytes", "log_every", "tp", "dp",
         "layers", "pp", "schedule", "virtual_stages", "ranks_per_node", "hpz_partition", "qgz_bits", "prefetch",
         "offload_optimizer", "offload_params", "nvme_path", "offload_buffers", "servers", "ps_mode",
         "staleness", "save_dir", "save_every", "keep", "init_from", "max_nonfinite", "max_restarts",
         "compress", "powersgd_rank", "compress_start", "topk_fraction", "trace", "trace_steps", "profile")


def flag_help(doc: str, default) -> str:
    """A field's docstring as its flag's help, in argparse's style: no capital or full stop, a
    field named by its flag, a pointer into the code (`plan.pipeline.schedule`) left to the
    library's reader, "None" as not given (or dropped, when not giving it means the default); then
    the default (a None's meaning is in the doc)."""
    if default is not None:
        doc = re.sub(r" \(None: [^)]*\)", "", doc)
    text = re.sub(r" \(`[^`]*`\)", "", doc).replace("`", "").replace("None:", "not given:").rstrip(".")
    text = re.sub(r"\b[a-z]+(?:_[a-z0-9]+)+\b", lambda m: "--" + m[0].replace("_", "-") if m[0] in FIELDS else m[0], text)
    first = text.split(" ", 1)[0]
    if first[:1].isupper() and first[1:].islower():
        text = text[0].lower() + text[1:]
    return (text + ("" if default is None else f" (default: {default})")).replace("%", "%%")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=None,
                   help="local ranks, talking through shared memory (--transport; default 1; under torchrun the world is torchrun's)")
    p.add_argument("--config", help="DeepSpeed-style JSON config (flags given explicitly win)")
    p.add_argument("--json-report", metavar="FILE.json",
                   help="write the run and its predicted/measured twins here")
    p.add_argument("--html-report", metavar="FILE.html",
                   help="write one self-contained page of the run: twins, curves, memory, bytes by kind, waits, timeline")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before every rank is stopped")
    policy = WatchdogPolicy()
    p.add_argument("--stall-timeout", type=float, default=policy.floor_s, metavar="S",
                   help=f"stop when the next step does not complete within max(S, {policy.factor:g} x the "
                        f"slowest step so far) seconds; the first step within S (default {policy.floor_s:g})")
    p.add_argument("--force", action="store_true",
                   help="start even if the planner says the ranks do not fit in this machine's memory")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar, log lines or tables (the predicted-vs-measured twins, the waits); "
                        "warnings, notes and the one-line results still print")
    p.add_argument("--checks", action="store_true",
                   help="verify before every collective that all ranks make the same call (one small "
                        "all-gather each: +12 %% step time on `make run`; also RINGZERO_CHECKS=1 or "
                        "TORCH_DISTRIBUTED_DEBUG=DETAIL)")
    allowed = choices()
    for name in FLAGS:
        f = FIELDS[name]
        kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, choices=allowed.get(name),
                       metavar=None if name in allowed else name.upper().replace("_", "-"),
                       help=flag_help(HELP[name], f.default))


    p.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="split LayerNorm and dropout along the sequence over the tp ranks (needs --tp > 1)")
    p.add_argument("--pipeline-cost", metavar="FWD_MS,BWD_MS", default=None,
                   help="synthetic pipeline costs: each stage's forward and backward of a micro-batch last at "
                        "least this long (a sleep), so the schedule, not shared cores, sets the timing")
    p.add_argument("--pipeline-plot", metavar="FILE.png",
                   help="draw the measured pipeline schedule here (.png, .svg, .pdf: any format matplotlib writes)")
    p.add_argument("--zeropp", metavar="qwz,hpz,qgz", default=None,
                   help="ZeRO++ on ZeRO-3: quantized weights (qwz), a node-local secondary weight partition "
                        "(hpz), quantized hierarchical gradients (qgz); any comma list")
    p.add_argument("--emulate-inter-node", metavar="BW[,LATENCY_US]", default=None, type=BandwidthFlag("--emulate-inter-node", link=True),
                   help="delay every cross-node message as a link of this bandwidth (e.g. 1GB/s, 10Gbit/s; a plain "
                        "number: GB/s) and latency (µs) would (needs --ranks-per-node)")
    p.add_argument("--straggler", metavar="RANK:FACTOR", default=None,
                   help="slow this worker's compute by FACTOR >= 1 (a sleep of the difference: no CPU)")
    p.add_argument("--inject-nonfinite", metavar="RANK:STEP", default=None,
                   help="put an inf into that rank's gradient at that step (a fault, to see it handled); "
                        "steps count from 0: step S is the one shown as S+1/N")
    p.add_argument("--inject-kill", metavar="RANK:STEP", default=None,
                   help="that rank kills itself (SIGKILL) as that step begins, once (to see --max-restarts work)")
    p.add_argument("--async-save", action="store_true", default=None,
                   help="write checkpoints on a background thread (the step waits only for the copy)")
    p.add_argument("--overwrite", action="store_true", default=None,
                   help="start in a --save-dir that holds another run's checkpoints, retiring those at or after "
                        "this run's saves (without it such a run is refused)")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                   help="continue from a checkpoint (its folder, or a --save-dir: its latest; without DIR: "
                        "--save-dir's), in any layout")
    p.add_argument("--layout", choices=("auto",), default=None,
                   help="auto: run the dp x tp x pp layout (and ZeRO stage, schedule) ringzero.plan "
                        "recommends for this model on these ranks")


def config_from(args: argparse.Namespace, world: int) -> TrainConfig:
    fields = train_args.given(args, FLAGS)
    cfg = from_deepspeed(args.config, world, **fields) if args.config else TrainConfig(**fields)
    if getattr(args, "layout", None) == "auto":
        cfg = auto_layout(cfg, world, fields)
    return cfg


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
    from ringzero.comm import config as comm_config
    from ringzero.train import data
    from ringzero.checkpoint.preflight import preflight
    from ringzero.twin import footprint
    from ringzero.run import ps_options
    from ringzero.run import zero_options
    from ringzero.comm import select
    from ringzero.twin.predict import transport_of

    world = _world(args, torchrun)
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    watch = WatchdogPolicy(floor_s=args.stall_timeout)
    comm_config.CommConfig()                      # reads RINGZERO_CHECKS / TORCH_DISTRIBUTED_DEBUG
    cfg = config_from(args, world)
    if cfg.kind is RunKind.PARAMETER_SERVER:       # --nproc counts the workers; the servers come on top
        world += 0 if torchrun else cfg.ps.servers
        ps_options.check_world(cfg, world)
        cfg.placement(ps_options.workers(cfg, world))
    else:
        ps_options.check_world(cfg, world)          # a straggler's rank
        cfg.placement(world)                       # tp and dp against the world
    if torchrun and cfg.faults.max_restarts:
        raise ValueError("--max-restarts restarts local ranks; under torchrun use torchrun's own --max-restarts "
                         "(with --save-dir, each restart resumes from the newest checkpoint)")
    train_args.check_injections(cfg, world)       # a rank that steps, a step the run takes
    zero_options.zeropp(cfg, world)                # ZeRO++'s blocks against the dp ranks
    if cfg.kind is RunKind.SINGLE and world != 1:
        raise ValueError(f"--strategy single runs on one rank, not --nproc {world}; use "
                         f"{', '.join(s for s in STRATEGIES if s != 'single')}")
    inputs = {"--data": cfg.training.data, "--config": args.config, "--init-from": cfg.checkpoint.init_from, "--resume": cfg.checkpoint.resume,
              "--nvme-path": cfg.zero.nvme_path, "--save-dir": cfg.checkpoint.save_dir}
    train_outputs.check(args, cfg, inputs)
    if not torchrun and cfg.kind is not RunKind.PARAMETER_SERVER:
        footprint.check(cfg, world, force=args.force)
    data.check(len(data.corpus_bytes(cfg.training.data, cfg.training.max_bytes)), cfg.shape.seq)   # path and size, checked now
    notes = list(preflight(train_restarts.torchrun_attempt(cfg, torchrun), world))   # every refusal before any note
    if not torchrun and cfg.kind is not RunKind.PARAMETER_SERVER:
        train_notes.offload_resources(cfg, world)      # says what offloading needs, then whether it has it
    for line in notes:
        train_notes.say(line)
    train_notes.compression(cfg)
    cfg = train_notes.transport(cfg, world, torchrun)    # last: its note only for a run that starts
    select.calibration(transport_of(cfg))     # a calibration made with another transport or host
    return Job(cfg, world, watch)


def _rank_main(cfg: TrainConfig, quiet: bool, torchrun: bool, checks: bool = False):
    import torch.distributed as dist

    from ringzero.comm import config as comm_config
    from ringzero.train.rank import train_rank
    from ringzero.commands.train_log import StepCallback
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
    if args.layout == "auto":
        print(f"ringzero: layout auto: dp={cfg.placement(world).dp} x tp={cfg.parallel.tp} x pp={cfg.parallel.pp}, strategy "
              f"{cfg.parallel.strategy}" + (f", schedule {cfg.parallel.schedule}" + (f" v={cfg.parallel.virtual_stages}" if cfg.parallel.virtual_stages > 1
                                                                  else "") if cfg.parallel.pp > 1 else "")
              + f", {cfg.training.grad_accum} micro-batch{'es' if cfg.training.grad_accum > 1 else ''} of {cfg.training.micro_batch} per step"
              + "\n  " + layout_why(cfg, world, "strategy" in train_args.given(args, FLAGS)), flush=True)
    if not torchrun and not args.quiet:      # said before torch is imported: spawning many ranks is slow
        how = "gloo on loopback" if cfg.parallel.transport == "gloo" or world == 1 else "shared memory"
        print(f"ringzero: starting {world} local rank{'s' if world > 1 else ''} ({how}) for "
              f"{cfg.training.steps} steps{train_args.emulated(args)}", file=sys.stderr, flush=True)
    results = train_restarts.run(_rank_main, cfg, world, args, torchrun, job.watch)
    if torchrun:
        if int(os.environ["RANK"]):
            return 0
        results = results if isinstance(results, list) else [results]
    _report(cfg, world, results, args)
    return 0


def _report(cfg: TrainConfig, world: int, results: list, args: argparse.Namespace) -> None:
    import io

    from rich.console import Console

    from ringzero import outputs
    from ringzero.twin import report
    from ringzero.twin import wait as report_wait
    from ringzero.twin.rates import unsteady
    console, path = Console(), args.json_report
    tables = Console(file=io.StringIO()) if args.quiet else console   # --quiet: built for the reports, unseen
    if cfg.trace.trace:            # the workers' traces (a parameter server's servers serve untraced)
        from ringzero.trace.write import write_traces
        write_traces(cfg.trace.trace, [r.trace for r in results if r.trace])
        console.print(f"wrote {os.path.join(cfg.trace.trace, 'merged.json')} and "
                      f"{os.path.join(cfg.trace.trace, 'ranks', 'rank<R>.json')}")
    if cfg.kind is RunKind.PARAMETER_SERVER:
        from ringzero.twin import ps as report_ps
        return report_ps.report(cfg, world, results, path, console, tables)
    console.print(report.validation_line(cfg, results[0].val))
    rows = report.twins(cfg, world, results)
    probes = report.probe_summary(cfg, world, results)
    report.render(rows, tables, probes, report.shown_rank(cfg, results))
    for line in report.unpriced(cfg, world, os.cpu_count() or 1):
        console.print(f"not priced: {line}")
    if loaded := unsteady(probes):          # the table's step-time error is then the load's as much as the model's
        console.print(f"not held: {loaded}")
    ranks = report_wait.render(cfg, results, tables)
    train_log.saves(results, console)
    if not (path or args.pipeline_plot or args.html_report):
        return
    data = report.to_json(cfg, world, results, rows, probes)
    report_wait.into_json(data["ranks"], ranks, results)
    data["argv"] = getattr(args, "argv", None)
    if path:
        outputs.write_text(path, json.dumps(data, indent=1))
        console.print(f"wrote {path}")
    train_outputs.figures(cfg, data, args, console)
