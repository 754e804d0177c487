"""Turning `ringzero train`'s flags into a `TrainConfig`: the flags that are not plain fields
(pipeline costs, ZeRO++ options, the emulated link, a straggler, an injected fault, --resume)."""

from __future__ import annotations

import argparse

from ringzero.plan.units import Link, parse_link

def _pipeline_cost(text: str | None) -> tuple[float, float] | None:
    """'FWD_MS,BWD_MS' -> (forward, backward) seconds; a bad one is refused here, in the
    milliseconds it was typed in, not in the seconds the config holds."""
    if text is None:
        return None
    try:
        ms = [float(x) for x in text.split(",")]
    except ValueError:
        ms = []
    if len(ms) != 2 or not all(0 <= x < float("inf") for x in ms):
        raise ValueError(f"--pipeline-cost {text!r}: give forward and backward milliseconds >= 0, e.g. 20,40")
    return ms[0] / 1e3, ms[1] / 1e3


def inter_node_link(value) -> tuple[float, float]:
    """--emulate-inter-node's `plan.units.Link` (or its text, 'BW[,LATENCY_US]') -> (GB/s, µs), the
    form `TrainConfig.emulate_inter_node` takes; a bad text is a one-line error."""
    link = value if isinstance(value, Link) else parse_link(value, "--emulate-inter-node")
    return link.gbps, link.latency_us


def emulated(args: argparse.Namespace) -> str:
    """', cross-node messages over an emulated 10 Gbit/s, 20 µs per message link': the start line's
    echo of --emulate-inter-node, in the unit it was given in ('' without it)."""
    link = getattr(args, "emulate_inter_node", None)
    return "" if link is None else f", cross-node messages over an emulated {link} link"


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
