"""`ringzero bench train --zeropp ...`: ZeRO++ against ZeRO-3 on the same ranks, nodes and link.

    ringzero bench train --nproc 4 --strategy zero3 --zeropp qwz,hpz,qgz --ranks-per-node 2 \
        --emulate-inter-node 1

Both variants train the same model from the same seed, one after the other, on the same ranks; each
rank meters its bytes by link kind (intra- or cross-node, `comm.meter`) at the measured step, and the
planner's twin of each (`twin.links`) is printed beside them. The goals: ZeRO++'s cross-node
bytes <= 0.27 x ZeRO-3's, and a lower step time when the emulated inter-node link is the bottleneck.
"""

from __future__ import annotations

import dataclasses
import statistics

from ringzero.run.config import TrainConfig

CROSS_BOUND = 0.27
"""ZeRO++'s cross-node bytes against ZeRO-3's (Wang et al. 2023 §3: 0.75Φ of 3Φ at 16 bits, with scales)."""


ALGORITHM = "ring"
"""The collectives' algorithm when --algorithm is auto: the classic ring, whose every message has its
cross-node twin in `plan.comm.links` (auto may pick one that has none)."""


def add_link(a) -> None:
    """The comparison's --emulate-inter-node, read by `plan.units`' one bandwidth rule."""
    from ringzero.plan.units import BandwidthFlag
    a("--emulate-inter-node", metavar="BW[,LATENCY_US]", type=BandwidthFlag("--emulate-inter-node", link=True),
      help="with --zeropp: delay cross-node messages as a link of this bandwidth (a plain number: GB/s) and "
           "latency (µs) would")


def build(args) -> tuple[TrainConfig, TrainConfig]:
    """(ZeRO-3, ZeRO-3 with ZeRO++) from the command line; one-line ValueError when a value is wrong."""
    from ringzero.commands.train_args import inter_node_link
    from ringzero.run import zero_options
    if args.strategy != "zero3":
        raise ValueError(f"--strategy {args.strategy!r}: ZeRO++ is compared with its base, zero3")
    if args.nproc < 2:
        raise ValueError(f"--nproc must be at least 2 for ZeRO++, got {args.nproc}")
    link = inter_node_link(args.emulate_inter_node) if args.emulate_inter_node else None
    base = TrainConfig(model=args.model, seq=args.seq, micro_batch=args.micro_batch, steps=args.steps, lr=args.lr,
                       strategy="zero3", comm_algorithm=ALGORITHM if args.algorithm == "auto" else args.algorithm, max_bytes=2**20, warmup=min(10, args.steps),
                       eval_every=10**6, eval_batches=1, ranks_per_node=args.ranks_per_node, emulate_inter_node=link)
    options = tuple(o.strip() for o in args.zeropp.split(",") if o.strip())
    plus = dataclasses.replace(base, zeropp=options)
    base.placement(args.nproc)
    zero_options.zeropp(plus, args.nproc)
    return base, plus


def rank_main(cfgs: tuple[TrainConfig, ...]) -> list[dict]:
    from ringzero.train.rank import train_rank
    out = []
    for cfg in cfgs:
        r = train_rank(cfg, calibrate=False)
        out.append({"rank": r.rank, "times": r.step_times, "losses": r.losses, "buckets": r.buckets,
                    "sp_elements": r.sp_elements, "traffic": r.traffic, "held": r.held})
    return out


def _variant(cfg: TrainConfig, world: int, ranks: list[dict]) -> dict:
    from ringzero.twin import links as predict_links
    times = [max(vals) for vals in zip(*(r["times"] for r in ranks))]
    metered = {k: sum(op.get(k, 0) for r in ranks for op in r["traffic"]["ops"].values())
               for k in ("bytes_sent", "cross_node_bytes_sent")}
    try:
        predicted = sum(predict_links.cross_node(cfg, world, r["buckets"], r["rank"], r["sp_elements"])
                        ["cross_node_bytes_sent"] for r in ranks)
    except ValueError:                  # an algorithm without a cross-node model: said, not guessed
        predicted = None
    return {"step_s": statistics.median(times), "times": times,         # steady steps (the engine's)
            "cross_node_bytes": metered["cross_node_bytes_sent"], "predicted_cross_node_bytes": predicted,
            "intra_node_bytes": metered["bytes_sent"] - metered["cross_node_bytes_sent"],
            "final_loss": ranks[0]["losses"][-1], "losses": ranks[0]["losses"]}


def benchmark(args) -> dict:
    from ringzero import launch, outputs
    from ringzero.errors import usage
    with usage():
        cfgs = build(args)
        if args.json:
            outputs.check(args.json, "--json")
    ranks = launch.spawn(rank_main, args.nproc, (cfgs,), timeout=args.timeout)
    base, plus = (_variant(c, args.nproc, [r[i] for r in ranks]) for i, c in enumerate(cfgs))
    base_cfg, plus_cfg = cfgs
    return {"nproc": args.nproc, "ranks_per_node": base_cfg.parallel.ranks_per_node,
            "zeropp": list(plus_cfg.zero.zeropp), "emulate_inter_node": base_cfg.parallel.emulate_inter_node,
            "link": None if args.emulate_inter_node is None else str(args.emulate_inter_node),
            "model": base_cfg.model.name, "steps": base_cfg.training.steps,
            "zero3": base, "zeropp_run": plus,
            "ratios": {"cross_node_bytes": plus["cross_node_bytes"] / base["cross_node_bytes"]
                       if base["cross_node_bytes"] else None,
                       "step_time": plus["step_s"] / base["step_s"],
                       "final_loss": plus["final_loss"] / base["final_loss"]}}


def print_report(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    link = result.get("link")               # as the user gave it
    t = Table(title=f"ZeRO++ ({','.join(result['zeropp'])}) vs ZeRO-3: {result['nproc']} ranks, "
                    f"{result['ranks_per_node']} per node, " + (f"inter-node link {link}" if link else "no link emulation"))
    for col in ("variant", "step time", "cross-node bytes/step (predicted)", "intra-node bytes/step", "final loss"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for name, key in (("ZeRO-3", "zero3"), ("ZeRO++", "zeropp_run")):
        v = result[key]
        t.add_row(name, f"{v['step_s'] * 1e3:,.1f} ms",
                  f"{v['cross_node_bytes'] / 2**20:,.3f} MiB ({_mib(v['predicted_cross_node_bytes'])})",
                  f"{v['intra_node_bytes'] / 2**20:,.3f} MiB", f"{v['final_loss']:.4f}")
    console = Console()
    console.print(t)
    r = result["ratios"]
    if r["cross_node_bytes"] is not None:
        met = "met" if r["cross_node_bytes"] <= CROSS_BOUND else "NOT met"
        console.print(f"cross-node bytes ZeRO++ / ZeRO-3: {r['cross_node_bytes']:.3f} (goal <= {CROSS_BOUND}: {met})")
    console.print(f"step time ZeRO++ / ZeRO-3: {r['step_time']:.3f}; final loss ratio {r['final_loss']:.4f}")


def _mib(n: int | None) -> str:
    return "not modelled" if n is None else f"{n / 2**20:,.3f}"
