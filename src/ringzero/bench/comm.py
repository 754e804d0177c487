"""`ringzero bench comm`: every collective × algorithm × size on `--nproc` ranks, like nccl-tests.

    ringzero bench comm --nproc 4 --collective all_reduce --sizes 64KiB,1MiB --compare
    ringzero bench comm --nproc 4 --calibrate          # fit α, β, γ and write the calibration

Columns follow nccl-tests: size (bytes of the whole buffer), count (elements), dtype, algorithm,
time (µs: the median repetition of the max over ranks), algbw = size / time and busbw = algbw ×
the collective's factor, which makes busbw comparable with the link speed whatever the collective
(all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all, gather, scatter (n-1)/n; broadcast and
reduce 1; nccl-tests' PERFORMANCE.md), and #wrong (elements that differ from the exact result in a
checked run of every cell; see `bench.comm_ranks`). `--compare` adds the backend's own collective as
algorithm "torch". All arguments are checked before any rank starts.

`--emulate-inter-node BW[,LATENCY_US]` with `--ranks-per-node K` turns the local ranks into nodes
of K joined by a BW network (a plain number: GB/s) (`comm.link_emulator`), and each row gains the bytes the busiest
rank sent to other nodes in one call (measured by the traffic meter) and the α-β prediction of the
time the emulated links add (`plan.comm.links.emulated_seconds`, for the algorithms it models):

    ringzero bench comm --nproc 4 --ranks-per-node 2 --emulate-inter-node 1,5 --collective all_reduce
"""

from __future__ import annotations

import json
import sys

import torch

from ringzero import launch, outputs
from ringzero.errors import usage
from ringzero.comm import cost, registry, select
from ringzero.comm.config import TRANSPORTS
from ringzero.comm.transport import preflight
from ringzero.comm.ops import SUPPORTED_DTYPES
from ringzero.plan.comm import links
from ringzero.plan.comm.volume import bus_factor, call_for
from ringzero.plan.units import BandwidthFlag, parse_sizes  # noqa: F401  (parse_sizes: this module's API)
from ringzero.run.config import TrainConfig
from ringzero.bench import comm_memory
from ringzero.bench.comm_ranks import Job, element_count, rank_main

DEFAULT_SIZES = tuple(1024 * 4 ** k for k in range(9))
"""1 KiB, 4 KiB, ..., 64 MiB."""
CALIBRATION = {"sizes": DEFAULT_SIZES[:-1], "iters": 3, "warmup": 1}
"""`--calibrate`'s defaults: 1 KiB..16 MiB (larger sizes take the 16 MiB correction, where time is
bandwidth's), three repetitions: a transport calibrated on 4 ranks here in under a minute."""

_DTYPES = tuple(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)


def _empty(option: str):
    raise ValueError(f"{option} needs at least one value")


def _names(values: list[str] | None) -> list[str]:
    """Repeated options and comma lists, flattened, in order, without duplicates."""
    out: list[str] = []
    for v in values or []:
        for x in (x.strip() for x in v.split(",")):
            if x and x not in out:
                out.append(x)
    return out


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip()) or _empty(option)
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got {text!r}") from None


def parse_emulation(value) -> tuple[float, float] | None:
    """--emulate-inter-node ('1', '10Gbit/s,20' or its parsed `plan.units.Link`) -> (GB/s, µs per
    message) of the emulated link, as `ringzero train` reads it; None: no emulation."""
    from ringzero.commands.train_args import inter_node_link
    return None if value is None else inter_node_link(value)


def _check_emulation(args, worlds, cases) -> tuple[float, float] | None:
    """The emulated link, if asked for, once it can make a difference and be measured."""
    emulation = parse_emulation(args.emulate_inter_node)
    if emulation is None:
        return None
    if args.ranks_per_node is None or args.ranks_per_node >= max(worlds):
        raise ValueError(f"--emulate-inter-node needs nodes to link: --ranks-per-node below the "
                         f"largest world ({max(worlds)}), got {args.ranks_per_node}")
    if any("torch" in algs for _, algs in cases):
        raise ValueError("--emulate-inter-node delays ringzero's own messages, not the backend's "
                         "collectives: drop algorithm 'torch' and --compare")
    if args.calibrate:
        raise ValueError("--calibrate fits this machine's links: it cannot be combined with "
                         "--emulate-inter-node")
    return emulation


def _cases(args) -> tuple[tuple[str, tuple[str, ...]], ...]:
    collectives = _names(args.collective) or list(registry.COLLECTIVES)
    for c in collectives:
        registry.check_name(c, "auto")
    wanted = _names(args.algorithm)
    for a in wanted:
        if a not in registry.SPECIAL and not any(a in registry.algorithms(c) for c in collectives):
            valid = sorted(set(registry.SPECIAL).union(*(registry.algorithms(c) for c in collectives)))
            raise ValueError(f"unknown algorithm {a!r} for {', '.join(collectives)}; "
                             f"valid: {', '.join(valid)}")
    cases = []
    for c in collectives:
        own = registry.algorithms(c)
        algs = [a for a in wanted or own if a in registry.SPECIAL or a in own]
        if args.compare and "torch" not in algs:
            algs.append("torch")
        if algs:
            cases.append((c, tuple(algs)))
    return tuple(cases)


def build_job(args) -> Job:
    """Validate every argument (ValueError with one line) and return what the ranks will do."""
    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {args.nproc}")
    if args.calibrate:                                   # the budgeted sweep, unless asked otherwise
        args.iters = CALIBRATION["iters"] if args.iters is None else args.iters
        args.warmup = CALIBRATION["warmup"] if args.warmup is None else args.warmup
        args.sizes = args.sizes or ",".join(str(s) for s in CALIBRATION["sizes"])
    args.iters = 5 if args.iters is None else args.iters
    args.warmup = 2 if args.warmup is None else args.warmup
    if args.iters < 1 or args.warmup < 0:
        raise ValueError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    if args.dtype not in _DTYPES:
        raise ValueError(f"unsupported --dtype {args.dtype!r}; allowed: {', '.join(_DTYPES)}")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise ValueError(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    # `ringzero train`'s own rule for nodes (equal ones; a partial node is measured with --worlds)
    TrainConfig(ranks_per_node=args.ranks_per_node).placement(args.nproc)
    sizes = parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES
    if args.calibrate:
        cost.check_sizes(sizes)
    if args.worlds:
        worlds = _ints(args.worlds, "--worlds")
    else:
        worlds = tuple(range(2, args.nproc + 1)) if args.calibrate else (args.nproc,)
    if args.calibrate and max(worlds, default=0) < 2:
        raise ValueError("--calibrate needs at least 2 ranks (--nproc 2 or more)")
    bad = [w for w in worlds if not 1 <= w <= args.nproc]
    if bad:
        raise ValueError(f"--worlds must lie in 1..--nproc ({args.nproc}), got {bad[0]}")
    cases = _cases(args)
    if args.calibrate and not any(a not in registry.SPECIAL for _, algs in cases for a in algs):
        raise ValueError("--calibrate fits ringzero's algorithms: --algorithm must name at least one "
                         f"besides {' and '.join(registry.SPECIAL)}")
    itemsize = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    for c, _ in cases:
        small = [s for s in sizes if element_count(c, s, itemsize, max(worlds)) == 0]
        if small:
            raise ValueError(f"size {small[0]} B holds no {args.dtype} element per rank for {c} "
                             f"on {max(worlds)} ranks")
    gbps, latency = _check_emulation(args, worlds, cases) or (None, 0.0)
    transport, note = preflight.transport_for(args.transport, worlds, launch.in_torchrun())
    if note:
        print(note, file=sys.stderr)
    if not args.calibrate:
        select.calibration(transport)          # "auto" would price with a file of another transport or host
    return Job(worlds=tuple(sorted(set(worlds))), cases=cases, sizes=sizes, dtype=args.dtype,
               iters=args.iters, warmup=args.warmup, ranks_per_node=args.ranks_per_node,
               every_algorithm=not args.algorithm, inter_node_gbps=gbps, inter_node_latency_us=latency,
               transport=transport)


def add_arguments(parser) -> None:
    a = parser.add_argument
    a("--nproc", type=int, default=4, help="local ranks to spawn (default 4)")
    a("--collective", action="append", help="collective(s) to measure, repeatable or a comma list (default: all)")
    a("--algorithm", action="append",
      help="algorithm(s) to measure each collective with, repeatable or a comma list; auto: the one the cost "
           "model picks, torch: the backend's own (default: every one of ringzero's)")
    a("--sizes", help="comma list of buffer sizes, e.g. 64KiB,1MiB (default 1KiB..64MiB by x4; 16MiB with --calibrate)")
    a("--dtype", default="float32", help=f"element type (default float32; {', '.join(_DTYPES)})")
    a("--iters", type=int, default=None, help="timed repetitions; the median is reported (default 5; 3 with --calibrate)")
    a("--warmup", type=int, default=None,
      help="warm-up calls per cell, also used to size a repetition (default 2; 1 with --calibrate)")
    a("--worlds", help="also measure on sub-groups of these sizes, e.g. 2,3,4 (default: --nproc; "
                       "with --calibrate 2..--nproc)")
    a("--ranks-per-node", type=int, help="emulate nodes of this many ranks (hierarchical, auto)")
    a("--emulate-inter-node", metavar="BW[,LATENCY_US]", type=BandwidthFlag("--emulate-inter-node", link=True),
      help="join the --ranks-per-node nodes by an emulated link of BW (e.g. 1GB/s, 10Gbit/s; a plain number: "
           "GB/s) and LATENCY_US µs per message (default 0): messages between nodes wait for it; rows gain the "
           "cross-node bytes and the α-β prediction of the emulated time")
    a("--transport", default="auto", choices=TRANSPORTS,
      help="how ringzero's messages travel: auto (shared memory between ranks of this host), shm, or gloo "
           "(default auto); the backend's own collectives (--compare) always take the backend")
    a("--compare", action="store_true", help="add the backend's own collective as algorithm 'torch'")
    a("--json", action="store_true", help="print machine-readable JSON instead of a table")
    a("--plot", metavar="FILE.png", help="write busbw vs size to this figure (.png, .svg, .pdf: any format "
                                         "matplotlib writes)")
    a("--calibrate", action="store_true", help="fit α, β, γ to the measurements and save them")
    a("--out", help="calibration file to write (default: RINGZERO_CALIBRATION or "
                    "~/.cache/ringzero/calibration.json)")
    a("--timeout", type=float, default=3600.0, help="seconds before the run is stopped (default 3600)")
    a("--force", action="store_true",
      help="start even if the buffers of --sizes on --nproc ranks do not fit in this machine's memory")


def bandwidths(row: dict) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s, as nccl-tests)."""
    algbw = row["size"] / (row["time_us"] * 1e-6) / 1e9 if row["time_us"] > 0 else 0.0
    return algbw, algbw * bus_factor(row["collective"], row["world"])


def measure(job: Job, nproc: int, timeout: float = 3600.0) -> list[dict]:
    """Run `job` on `nproc` fresh local ranks; rows with algbw and busbw filled in."""
    rows = launch.spawn(rank_main, nproc, (job,), timeout=timeout)[0]
    for row in rows:
        row["algbw"], row["busbw"] = bandwidths(row)
        if job.inter_node_gbps is not None:
            row["emulated_us"] = emulated_us(row, job.inter_node_gbps, job.inter_node_latency_us)
    return rows


def emulated_us(row: dict, gbps: float, latency_us: float) -> float | None:
    """`plan.comm.links.emulated_seconds` of a row's call in µs; None for an algorithm it does not model.

    The bench's groups are the prefixes {0..w-1}, so group rank i is global rank i."""
    collective, algorithm, n = row["collective"], row["algorithm"], row["world"]
    if algorithm not in links.modelled(collective):
        return None
    call = call_for(collective, algorithm, n, row["count"], row["itemsize"],
                    ranks_per_node=row["ranks_per_node"])
    return links.emulated_seconds(call, range(n), row["ranks_per_node"], gbps, latency_us) * 1e6


def run(args) -> int:
    with usage():
        job = build_job(args)
        if args.out is not None and not args.calibrate:
            raise ValueError("--out names the calibration file: it needs --calibrate")
        if args.plot:
            outputs.plot_format(args.plot, "--plot")
        if args.out:
            outputs.check(args.out, "--out")
        comm_memory.check(job.sizes, args.nproc, job.cases, job.worlds, force=args.force)      # last, as `train` checks its footprint
    rows = measure(job, args.nproc, args.timeout)
    cal = path = None
    if args.calibrate:
        cal = cost.fit(rows, meta={"nproc": args.nproc, "dtype": args.dtype, "worlds": list(job.worlds)},
                       transport=job.transport)
        path = cost.save(cal, args.out)
    if args.json:
        out = {"nproc": args.nproc, "rows": rows}
        if cal is not None:
            out["calibration"] = {"path": str(path), **cal.to_json()}
        print(json.dumps(out, indent=1))
    else:
        from ringzero.bench.comm_report import print_calibration, print_table
        print_table(rows)
        if args.emulate_inter_node is not None:
            print(f"emulated link between nodes of {args.ranks_per_node} ranks: {args.emulate_inter_node}")
        if cal is not None:
            print_calibration(cal, path)
    if args.plot:
        from ringzero.bench.comm_report import plot
        plot(rows, args.plot)
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        print(f"ringzero: {wrong} wrong elements (see #wrong)", file=sys.stderr)
    return 1 if wrong else 0
