"""`ringzero bench ps`: all-reduce data parallelism against a parameter server under a straggler.

    ringzero bench ps --nproc 4 --servers 2 --steps 60 --plot out/bench_ps.png --json out/bench_ps.json

The same model, data and seed with worker 1 computing `--straggler` times as long (a sleep, so it
takes no core from the others) for: all-reduce DP (`--strategy dp`), the sync parameter server, the
async one and SSP with each `--staleness`. Each run takes `--steps` steps per worker. Printed per mode:
the wall-clock seconds of the run, the time worker 0 (not the straggler) first saw the validation
loss at or below `--target` (default: DP's final loss plus 2 %), its validation loss at the end,
the updates the servers applied (W per step unless sync), the staleness of those updates (mean,
max), and the bytes into the busiest server per step against the ring's bytes sent per rank per
step. The plot: validation loss against wall-clock time, one line per mode, as worker 0 saw it
(asynchronous training is faster per second under a straggler and noisier per update: Li et al.
2014 §5; Ho et al. 2013 §5).
"""

from __future__ import annotations

import json
import statistics
import time

from ringzero.run.config import TrainConfig

BASE = dict(model="nano", seq=64, micro_batch=4, eval_batches=2, max_bytes=1 << 20, lr=3e-3, warmup=5)


def add_arguments(parser) -> None:
    a = parser.add_argument
    a("--nproc", type=int, default=4, help="workers (default 4; DP runs on as many ranks)")
    a("--servers", type=int, default=None, help="server ranks on top of the workers (default nproc/2)")
    a("--steps", type=int, default=60, help="steps per worker (default 60)")
    a("--eval-every", type=int, default=5, help="validation every N steps (default 5)")
    a("--straggler", type=float, default=2.0, help="worker 1's compute factor (default 2)")
    a("--staleness", default="1,4,16", help="SSP bounds to run, a comma list (default 1,4,16)")
    a("--target", type=float, default=None, help="validation loss to reach (default: DP's final + 2 %%)")
    a("--plot", default=None, help="draw validation loss against time into this figure (.png, .svg, .pdf, ...)")
    a("--json", default=None, help="write the rows here")


def _modes(args) -> list[tuple[str, dict]]:
    try:
        bounds = [int(s) for s in args.staleness.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--staleness takes comma-separated integers >= 0, got {args.staleness!r}") from None
    servers = args.servers if args.servers is not None else max(1, args.nproc // 2)
    ps = dict(strategy="ps", servers=servers)
    return ([("dp", dict(strategy="dp")), ("sync", dict(ps)), ("async", dict(ps, ps_mode="async"))]
            + [(f"ssp {s}", dict(ps, ps_mode="ssp", staleness=s)) for s in bounds])


def check(args) -> list[tuple[str, TrainConfig]]:
    """The runs, every config validated and every output path checked before a rank starts."""
    from ringzero import outputs
    from ringzero.run.ps_options import check_world
    if args.nproc < 2:
        raise ValueError(f"--nproc must be >= 2 (worker 1 is the straggler), got {args.nproc}")
    if args.steps < 1 or args.eval_every < 1:
        raise ValueError("--steps and --eval-every must be >= 1")
    runs = []
    for name, kw in _modes(args):
        cfg = TrainConfig(**BASE, steps=args.steps, eval_every=args.eval_every, straggler=(1, args.straggler), **kw)
        check_world(cfg, args.nproc + cfg.ps.servers)
        runs.append((name, cfg))
    if args.plot:
        outputs.plot_format(args.plot, "--plot")
    if args.json:
        outputs.check(args.json, "--json")
    return runs


def _rank(cfg: TrainConfig):
    from ringzero.train.rank import train_rank
    return train_rank(cfg, calibrate=False)


def measure(name: str, cfg: TrainConfig, workers: int) -> dict:
    from ringzero import launch
    from ringzero.run.kind import RunKind
    world = workers + (cfg.ps.servers if cfg.kind is RunKind.PARAMETER_SERVER else 0)
    t0 = time.perf_counter()
    results = launch.run(_rank, world, args=(cfg,), backend="gloo")
    wall = time.perf_counter() - t0
    w0 = results[0]
    own = w0.ps.get("own_val", w0.val)
    servers = [r for r in results if r.role == "server"]
    staleness = [s for r in servers for s in r.ps["staleness"]]
    grid = cfg.kind is RunKind.GRID                  # the all-reduce baseline
    ring = sum(op["bytes_sent"] for op in w0.traffic.get("ops", {}).values()) if grid else None
    ingress = max((r.traffic["ops"]["ps/push"]["bytes_recv"] / cfg.training.steps for r in servers), default=None)
    return {"mode": name, "wall_s": wall, "val": [(s, v, t) for (s, v), t in zip(own, w0.val_at_s)],
            "final_val": own[-1][1], "updates": sum(r.ps["updates"] for r in servers) // max(1, len(servers))
            if servers else cfg.training.steps, "staleness_mean": statistics.fmean(staleness) if staleness else 0.0,
            "staleness_max": max(staleness, default=0), "busiest_server_bytes": ingress, "ring_bytes": ring}


def reached(row: dict, target: float) -> float | None:
    """Seconds into the run when worker 0's validation loss first reached `target` (None: never)."""
    return next((t for _, v, t in row["val"] if v <= target), None)


def render(rows: list[dict], target: float, workers: int, servers: int) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"{workers} workers, worker 1 slowed; ps with {servers} servers; target validation loss "
                    f"{target:.3f} (as worker 0 saw it)",
              caption="mode: all-reduce dp, or the parameter server's; run: seconds of the run; target: "
                      "seconds until worker 0 saw the target; MiB in: per step into the busiest server "
                      "(dp: sent per rank by the ring)", caption_justify="left")
    for col in ("mode", "run s", "target s", "final val", "updates", "staleness", "MiB in"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for r in rows:
        hit = reached(r, target)
        nbytes = r["busiest_server_bytes"] if r["busiest_server_bytes"] is not None else r["ring_bytes"]
        t.add_row(r["mode"], f"{r['wall_s']:.1f}", "-" if hit is None else f"{hit:.1f}", f"{r['final_val']:.3f}",
                  str(r["updates"]), f"{r['staleness_mean']:.1f}/{r['staleness_max']}", f"{nbytes / 2**20:.2f}")
    Console().print(t)


def plot(rows: list[dict], path: str, target: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ringzero import outputs
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        ax.plot([t for *_, t in r["val"]], [v for _, v, _ in r["val"]], marker=".", label=r["mode"])
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target:.3f}")
    ax.set(xlabel="wall-clock seconds (worker 0)", ylabel="validation loss",
           title="all-reduce DP and a parameter server, one worker slowed")
    ax.legend()
    fmt = outputs.plot_format(path, "--plot")
    outputs.write_with(path, lambda f: fig.savefig(f, format=fmt, dpi=120), binary=True)
    plt.close(fig)


def run(args) -> int:
    from ringzero.errors import usage
    with usage():                          # bad input: one line, exit 2, before any rank starts
        runs = check(args)
    rows = [measure(name, cfg, args.nproc) for name, cfg in runs]
    target = args.target if args.target is not None else rows[0]["final_val"] * 1.02
    servers = runs[1][1].ps.servers
    render(rows, target, args.nproc, servers)
    if args.plot:
        plot(rows, args.plot, target)
        print(f"wrote {args.plot}")
    if args.json:
        from ringzero import outputs
        outputs.write_text(args.json, json.dumps({"target": target, "rows": rows}, indent=1) + "\n")
    return 0
