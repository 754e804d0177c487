"""`ringzero train`'s outputs besides the table: checked before any rank starts (one line, exit 2,
nothing written) and written after the run: the JSON report's path, the trace and profiler
folders, the pipeline plot and the HTML page."""

from __future__ import annotations

import argparse
import os

from ringzero import outputs
from ringzero.checkpoint.folders import not_claimed
from ringzero.commands import train_args
from ringzero.run import trace_options
from ringzero.run.config import TrainConfig


def _outside_checkpoints(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """No output writes into a checkpoint, nor is a save folder (this run's --save-dir included)
    or one of its `latest` and step-NNNNNNNN names (`checkpoint.folders.claimed`)."""
    paths = {"--trace": cfg.trace.trace, "--profile": cfg.trace.profile, "--json-report": args.json_report,
             "--pipeline-plot": getattr(args, "pipeline_plot", None), "--html-report": getattr(args, "html_report", None)}
    save_dirs = (cfg.checkpoint.save_dir,) if cfg.checkpoint.save_dir else ()
    for flag, path in paths.items():
        if path:
            not_claimed(path, flag, save_dirs)


def check(args: argparse.Namespace, cfg: TrainConfig, inputs: dict) -> None:
    """Every output path against the inputs, the checkpoints and the file system; the traced steps
    against the run."""
    _outside_checkpoints(args, cfg)
    if args.json_report:
        outputs.check(args.json_report, "--json-report")
        outputs.not_an_input(args.json_report, "--json-report", inputs)
    trace_options.check(cfg, train_args.first_step(cfg))
    for flag, folder in (("--trace", cfg.trace.trace), ("--profile", cfg.trace.profile)):
        if folder is not None:
            outputs.folder(folder, flag)
            outputs.not_an_input(os.path.join(folder, "rank0.json"), flag, inputs)
    if getattr(args, "pipeline_plot", None):
        if cfg.parallel.pp == 1:
            raise ValueError("--pipeline-plot draws a pipeline's schedule: it needs --pp > 1")
        outputs.plot_format(args.pipeline_plot, "--pipeline-plot")
        outputs.not_an_input(args.pipeline_plot, "--pipeline-plot", {**inputs, "--json-report": args.json_report})
    if getattr(args, "html_report", None):
        outputs.check(args.html_report, "--html-report")
        if not args.html_report.endswith((".html", ".htm")):
            raise ValueError(f"--html-report {args.html_report!r}: give a FILE.html")
        outputs.not_an_input(args.html_report, "--html-report", {**inputs, "--json-report": args.json_report})


def figures(cfg: TrainConfig, data: dict, args: argparse.Namespace, console) -> None:
    """The pipeline plot and the HTML page of a run's report `data` (`twin.report.to_json`'s)."""
    if args.pipeline_plot:
        from ringzero.twin.pipeline_plot import plot as draw
        pipe, plot = data["pipeline"], args.pipeline_plot
        v = f", v={cfg.parallel.virtual_stages}" if cfg.parallel.virtual_stages > 1 else ""
        draw(pipe["timeline"], plot, title=f"{cfg.parallel.schedule}{v}: pp={cfg.parallel.pp}, m={cfg.training.grad_accum} "
                                           f"(measured, last steady step)", bubble=pipe["idle_fraction"]["measured"],
             predicted=pipe["idle_fraction"]["predicted"])
        console.print(f"wrote {plot}")
    if args.html_report:
        from ringzero.page import html
        html.write(args.html_report, data, html.merged_trace(cfg.trace.trace))
        console.print(f"wrote {args.html_report}")
