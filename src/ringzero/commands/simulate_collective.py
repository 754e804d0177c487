"""`ringzero simulate collective`: one collective on a modelled cluster, in nccl-tests' columns.

    ringzero simulate collective --collective all_reduce --algorithm ring --gpus 1024 --topology dgx-h100
    ringzero simulate collective --algorithm auto --gpus 16384 --sizes 1M,64M,1G --json
    ringzero simulate collective --gpus 64 --nic-bw 12.5GB/s --oversubscription 2
    ringzero simulate collective --gpus 256 --algorithm ring --straggler 17:2 --degrade nic3.1:4

The algorithm's own schedule (`plan.comm.schedule`) is played on the topology (`simulate`): each
size's time, nccl-tests' algbw (size / time) and busbw (algbw times the collective's bus factor,
2(n-1)/n for all-reduce), and the link that was busiest, with its utilisation over the call.
"auto" keeps the fastest algorithm that runs on the group, per size, playing only those whose
lower bound does not rule them out (`simulate.auto`). A straggler
(--straggler GPU:FACTOR) sends at 1/FACTOR of the rate it would get; a degraded link (--degrade
LINK:FACTOR, LINK as the busiest-link column names it: gpu5, nic3.2, leaf4) carries 1/FACTOR of
its capacity; each row then shows the slowdown against the healthy cluster. Every flag is
checked before anything is played (`errors.usage`): one line, exit code 2.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ringzero.errors import usage
from ringzero.plan.comm.algorithms import ALGORITHMS, fits
from ringzero.plan.comm.schedule.build import call_checked
from ringzero.plan.units import BandwidthFlag, parse_sizes
from ringzero.commands import progress
from ringzero.simulate.auto import fastest
from ringzero.simulate.collective import bandwidths, candidates, simulate
from ringzero.simulate.topology import PRESETS, Topology, preset

DEFAULT_SIZES = "1M,4M,16M,64M,256M,1G,4G,8G"
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "float64": 8}
OVERRIDES = {  # flag -> (Topology field, kind, help)
    "gpus-per-node": ("gpus_per_node", "int", "GPUs in one NVSwitch domain"),
    "nvlink-bw": ("nvlink_bw", "rate", "NVLink bandwidth per GPU per direction (e.g. 450GB/s; a plain number: GB/s)"),
    "nvlink-latency": ("nvlink_latency", "us", "µs per message inside a node"),
    "nics-per-node": ("nics_per_node", "int", "NICs per node (8: one per GPU; 1: one shared NIC)"),
    "nic-bw": ("nic_bw", "rate", "bandwidth per NIC per direction (e.g. 400Gbit/s; a plain number: GB/s)"),
    "nic-latency": ("nic_latency", "us", "µs per message between nodes"),
    "switch-latency": ("switch_latency", "us", "µs added per spine crossing"),
    "nodes-per-leaf": ("nodes_per_leaf", "int", "nodes under one leaf switch (per rail)"),
    "oversubscription": ("oversubscription", "float", "leaf ports down / up (1: non-blocking)"),
}


def add_arguments(parser) -> None:
    parser.description = __doc__.splitlines()[0].split(": ", 1)[1]
    a = parser.add_argument
    a("--collective", default="all_reduce", help=f"one of {', '.join(ALGORITHMS)}")
    a("--algorithm", default="auto", help="an algorithm of the collective, or auto (the fastest per size)")
    a("--gpus", type=int, default=64, help="GPUs in the group (a multiple of the GPUs per node)")
    a("--topology", default="dgx-h100", help=f"preset: {', '.join(PRESETS)}")
    a("--sizes", default=DEFAULT_SIZES, help=f"buffer sizes in bytes (default {DEFAULT_SIZES})")
    a("--dtype", default="float32", help=f"element type: {', '.join(ITEMSIZE)}")
    a("--shared-nic", action="store_true", help="the node's NICs on one leaf, not one rail each")
    a("--pxn", action="store_true", help="a message between rails goes over NVLink to its rail's GPU first "
                                         "(NCCL's PXN)")
    a("--straggler", action="append", default=[], metavar="GPU:FACTOR",
      help="a GPU sending FACTOR times slower (repeatable)")
    a("--degrade", action="append", default=[], metavar="LINK:FACTOR",
      help="a link (gpuG, nicJ.K, leafL) at 1/FACTOR of its capacity (repeatable)")
    a("--json", action="store_true", help="one JSON object instead of the table")
    a("--quiet", action="store_true", help=progress.QUIET_HELP)
    g = parser.add_argument_group("topology overrides (default: the preset's figure)")
    add_overrides(g, OVERRIDES)


def add_overrides(group, overrides: dict) -> None:
    """The topology override flags of `overrides` (a bandwidth parsed as `plan.units` reads one)."""
    for flag, (_, kind, what) in overrides.items():
        rate = kind == "rate"
        group.add_argument(f"--{flag}", default=None, metavar="BW" if rate else "X", help=what,
                           type=BandwidthFlag(f"--{flag}") if rate else None)


def _value(flag: str, kind: str, text):
    if kind == "rate":
        return text.bytes_per_s                 # a `Bandwidth`: parsed with the command line
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "us":
            return float(text) * 1e-6
    except ValueError:
        raise ValueError(f"--{flag}={text!r}: expected a number") from None
    raise ValueError(f"unknown kind {kind!r} of --{flag}")


def echoed(args, flags) -> str:
    """'; --nic-bw 400 Gbit/s' for each bandwidth flag of `flags` given: echoed in the unit typed."""
    return "".join(f"; --{f} {getattr(args, f.replace('-', '_'))}" for f in flags
                   if getattr(args, f.replace("-", "_"), None) is not None)


def _pairs(values: list[str], flag: str, what: str) -> list[tuple[str, float]]:
    out = []
    for v in values:
        name, _, factor = v.rpartition(":")
        try:
            out.append((name, float(factor)))
        except ValueError:
            raise ValueError(f"--{flag} {v!r}: expected {what}:FACTOR, e.g. {'17:2' if flag == 'straggler' else 'nic3.1:4'}") from None
        if not name:
            raise ValueError(f"--{flag} {v!r}: expected {what}:FACTOR")
    return out


def topology(args) -> Topology:
    over = {field: _value(flag, kind, getattr(args, flag.replace("-", "_")))
            for flag, (field, kind, _) in OVERRIDES.items() if getattr(args, flag.replace("-", "_")) is not None}
    if args.shared_nic:
        over["rail_optimized"] = False
    if args.pxn:
        over["pxn"] = True
    over["degrade"] = tuple(_pairs(args.degrade, "degrade", "LINK"))
    return preset(args.topology, args.gpus, **over)


def stragglers(args, gpus: int) -> dict[int, float]:
    out = {}
    for gpu, factor in _pairs(args.straggler, "straggler", "GPU"):
        if not gpu.isdigit() or int(gpu) >= gpus:
            raise ValueError(f"--straggler {gpu}:{factor:g}: GPU {gpu} is outside the world 0..{gpus - 1}")
        if not factor >= 1:
            raise ValueError(f"--straggler {gpu}:{factor:g}: the factor must be >= 1 (a slower GPU)")
        out[int(gpu)] = factor
    return out


def check(args) -> tuple[Topology, tuple[int, ...], list[str], dict[int, float]]:
    """(topology, sizes, algorithms to play, stragglers) or a ValueError naming the bad flag."""
    if args.collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {args.collective!r}; allowed: {', '.join(ALGORITHMS)}")
    if args.dtype not in ITEMSIZE:
        raise ValueError(f"unknown dtype {args.dtype!r}; allowed: {', '.join(ITEMSIZE)}")
    if args.gpus < 2:
        raise ValueError(f"--gpus must be >= 2, got {args.gpus}")
    topo = topology(args)
    slow = stragglers(args, topo.gpus)
    sizes = parse_sizes(args.sizes)
    known = list(ALGORITHMS[args.collective])
    if args.algorithm == "auto":
        algs = candidates(args.collective, topo)
    elif args.algorithm not in known:
        raise ValueError(f"unknown algorithm {args.algorithm!r} for {args.collective}; allowed: "
                         f"{', '.join(known)}, auto")
    elif not fits(args.algorithm, topo.gpus, topo.gpus_per_node):
        raise ValueError(f"{args.algorithm} cannot run on {topo.gpus} GPUs of {topo.gpus_per_node} per node: "
                         f"it needs whole nodes")
    else:
        algs = [args.algorithm]
    item = ITEMSIZE[args.dtype]
    for size in sizes:
        if size % item:
            raise ValueError(f"size {size} is not a whole number of {args.dtype} elements ({item} bytes)")
    return topo, sizes, algs, slow


def rows(args, topo: Topology, sizes, algs, slow: dict[int, float], shown=None) -> list[dict]:
    """One row per size: the fastest of `algs` played (`auto.fastest`); `shown`: a progress display."""
    item, out = ITEMSIZE[args.dtype], []
    hurt = bool(slow or topo.degrade)
    healthy = replace(topo, degrade=())
    for size in sizes:
        if shown is not None:
            shown.advance(f"{size:,} B")
        won = fastest(args.collective, algs, topo, size, item, slow)
        best, p = won.algorithm, won.played
        extra = {}
        if hurt:
            extra["healthy_us"] = simulate(args.collective, best, healthy, size, item).seconds * 1e6
            extra["slowdown"] = p.seconds * 1e6 / extra["healthy_us"]
        algbw, busbw = bandwidths(args.collective, topo.gpus, size, p.seconds)
        link, util = p.busiest(topo)
        out.append(dict(size=size, count=size // item, type=args.dtype, algorithm=best, time_us=p.seconds * 1e6,
                        algbw=algbw, busbw=busbw, busiest_link=link, link_util=util, steps=p.steps,
                        played=p.plays, exact=p.exact, compared=list(won.compared), **extra))
    return out


def run(args) -> int:
    with usage():
        topo, sizes, algs, slow = check(args)
        algs, skipped = fitting(args, topo, sizes, algs)
    with progress.shown(args, f"simulating {args.collective} on {topo.gpus:,} GPUs", len(sizes)) as shown:
        table = rows(args, topo, sizes, algs, slow, shown)
    if args.json:
        print(json.dumps({"collective": args.collective, "gpus": topo.gpus, "topology": topo.name, "rows": table,
                          "skipped": skipped}))
        return 0
    _render(args, topo, table)
    if skipped:
        print(f"auto left out (schedule past the simulator's bound): {', '.join(skipped)}")
    return 0


def fitting(args, topo: Topology, sizes, algs: list[str]) -> tuple[list[str], list[str]]:
    """(algorithms whose schedule fits the simulator's bound at the largest size, those left out).
    A schedule too large to hold is bad input: one named algorithm, or every one of "auto", is
    refused with its size before anything is played."""
    keep, skipped, first = [], [], None
    item = ITEMSIZE[args.dtype]
    for a in algs:
        try:
            call_checked(args.collective, a, topo.gpus, max(sizes) // item, item, 0, topo.gpus_per_node)
            keep.append(a)
        except ValueError as exc:
            if args.algorithm != "auto":
                raise
            skipped.append(a)
            first = first or exc
    if not keep:
        raise first
    return keep, skipped


def _render(args, topo: Topology, table: list[dict]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    rates = [f for f, (_, kind, _) in OVERRIDES.items() if kind == "rate"]
    t = Table(title=f"{args.collective} on {topo.gpus:,} GPUs ({topo.name}: {topo.nodes:,} nodes of "
                    f"{topo.gpus_per_node}{echoed(args, rates)}), simulated", title_justify="left", box=box.SIMPLE_HEAD)
    hurt = "slowdown" in table[0]
    for name in ("size (B)", "count", "type", "algorithm", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                 "busiest link", "util") + (("slowdown",) if hurt else ()):
        t.add_column(name, justify="left" if name in ("type", "algorithm", "busiest link") else "right")
    for r in table:
        t.add_row(str(r["size"]), str(r["count"]), r["type"], r["algorithm"], f"{r['time_us']:.1f}",
                  f"{r['algbw']:.2f}", f"{r['busbw']:.2f}", r["busiest_link"], f"{r['link_util']:.0%}",
                  *((f"{r['slowdown']:.2f}x",) if hurt else ()))
    Console(width=max(Console().width, 132)).print(t)      # the nine columns of a row on one line
