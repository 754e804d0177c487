"""Turning `ringzero train`'s flags into a `TrainConfig`: the flags that are not plain fields
(pipeline costs, ZeRO++ options, the emulated link, a straggler, an injected fault, --resume)."""

from __future__ import annotations

import argparse
import math

def _pipeline_cost(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        fwd, bwd = (float(x) / 1e3 for x in text.split(","))
    except ValueError:
        raise ValueError(f"--pipeline-cost {text!r}: give forward and backward milliseconds, e.g. 20,40") from None
    return fwd, bwd


def inter_node_link(text: str) -> tuple[float, float]:
    """'GBPS[,LATENCY_US]' -> (GB/s, µs), or a one-line error."""
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or not all(math.isfinite(x) for x in parts) or parts[0] <= 0 or min(parts) < 0:
        raise ValueError(f"--emulate-inter-node {text!r}: give GB/s > 0 and optionally latency µs >= 0, e.g. 1 or 1,20")
    return parts[0], parts[1] if len(parts) == 2 else 0.0


def straggler(text: str) -> tuple[int, float]:
    """--straggler RANK:FACTOR, e.g. 1:2 (rank 1 computes twice as long)."""
    try:
        rank, factor = text.split(":")
        return int(rank), float(factor)
    except ValueError:
        raise ValueError(f"--straggler {text!r}: give RANK:FACTOR, a worker rank and a factor >= 1, "
                         "e.g. 1:2") from None


def check_injections(cfg, world: int) -> None:
    """The injected faults (--inject-nonfinite, --inject-kill) against the run, or a one-line
    ValueError: the rank must be one where the fault happens (an inf goes into a gradient, which a
    parameter server's servers do not compute; any rank can be killed, a server as its clock
    reaches the step), and the step one that this run takes. Steps count from 0 as the engine's
    loop does: step s is the one the progress shows as "step s+1/N", and a kill at step s comes
    right after the checkpoint of step s. A resumed run takes only the steps from its checkpoint's
    on (`TrainConfig` itself refuses a step at or beyond --steps)."""
    from ringzero.run.kind import RunKind
    from ringzero.run.ps_options import workers
    faults = [(f, inj) for f, inj in (("--inject-nonfinite", cfg.faults.inject_nonfinite), ("--inject-kill", cfg.faults.inject_kill))
              if inj is not None]
    if not faults:
        return
    first = first_step(cfg)
    for flag, (rank, step) in faults:
        gradient = flag == "--inject-nonfinite"
        ranks = workers(cfg, world) if gradient else world
        if rank >= ranks:
            whose = " that compute gradients (the servers compute none)" if gradient and cfg.kind is RunKind.PARAMETER_SERVER else ""
            raise ValueError(f"{flag} rank {rank} is not one of the {ranks} ranks{whose}; allowed: 0-{ranks - 1}")
        if not first <= step < cfg.training.steps:
            resumed = f" (it resumes from the checkpoint of step {first})" if first else ""
            raise ValueError(f"{flag} step {step} is not one this run takes{resumed}; allowed: "
                             f"{first}-{cfg.training.steps - 1} (steps count from 0)")


def first_step(cfg) -> int:
    """The step a run starts at: its checkpoint's with --resume, else 0."""
    if cfg.checkpoint.resume is None:
        return 0
    from ringzero.checkpoint.folders import resolve
    from ringzero.checkpoint.manifest import read
    return read(resolve(cfg.checkpoint.resume)).step


def given(args: argparse.Namespace, flags: tuple[str, ...]) -> dict:
    """The TrainConfig fields the command line sets: the plain `flags`, and the parsed ones."""
    out = {k: getattr(args, k) for k in flags + ("sequence_parallel", "async_save", "overwrite") if getattr(args, k, None) is not None}
    cost = _pipeline_cost(getattr(args, "pipeline_cost", None))
    if cost is not None:
        out["pipeline_cost"] = cost
    if getattr(args, "zeropp", None) is not None:
        out["zeropp"] = tuple(o.strip() for o in args.zeropp.split(",") if o.strip())
    if getattr(args, "emulate_inter_node", None) is not None:
        out["emulate_inter_node"] = inter_node_link(args.emulate_inter_node)
    if getattr(args, "straggler", None) is not None:
        out["straggler"] = straggler(args.straggler)
    for name in ("inject_nonfinite", "inject_kill"):
        text = getattr(args, name, None)
        if text is None:
            continue
        try:
            rank, step = (int(v) for v in text.split(":"))
        except ValueError:
            raise ValueError(f"--{name.replace('_', '-')} {text!r}: give RANK:STEP, e.g. 1:5") from None
        out[name] = (rank, step)
    if getattr(args, "resume", None) is not None:
        out["resume"] = args.resume or getattr(args, "save_dir", None)
        if not out["resume"]:
            raise ValueError("--resume without a folder resumes --save-dir's latest checkpoint: give --save-dir "
                             "or --resume DIR")
    return out
