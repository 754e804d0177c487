"""Speed of `ringzero.simulate`: how long the simulator takes to play collectives on large clusters.

The goals: a 16,384-GPU ring, tree and hierarchical all-reduce of 1 GiB each in under 1 s, "auto"
at 16,384 GPUs (1 MiB, 1 GiB) in under 2 s each, and an
8-size nccl-tests sweep (1 MiB to 8 GiB) at 1,024 GPUs in under 5 s, on a 2-core machine. Each case
is timed end to end (schedule built from the algorithm, routed, played) as the best of `--repeat`
runs; the simulated time and busbw are printed beside it so a change in speed that also changes
the answer shows. Every algorithm of the sweep is timed too, "auto" (all of them, keep the fastest)
last. Then the published nccl-tests runs (`simulate.published`): the links fitted at two sizes
(`simulate.calibrate`), every other size from 16 MiB up simulated untouched, with its error. `--plot` draws the scaling picture: busbw of a 1 GiB all-reduce against GPUs (8 to 16,384)
for each algorithm on DGX H100 nodes (rabenseifner, listed message by message, up to 2,048).

    .venv/bin/python benchmarks/bench_simulate.py [--repeat 3] [--json out/bench_simulate.json]
                                                  [--plot docs/simulate-scaling.png]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from ringzero.simulate import calibrate
from ringzero.simulate.collective import bandwidths, candidates, simulate
from ringzero.simulate.published import AZURE_ND_A100_V4, GCP_A3_MEGA_16, MiB
from ringzero.simulate.topology import preset

GiB = 1 << 30
SWEEP = tuple(1 << p for p in range(20, 33, 2)) + (8 * GiB,)           # 1M, 4M, ..., 4G, 8G: 8 sizes
GOALS = {"large": 1.0, "sweep": 5.0, "auto": 2.0}


def _best(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def large(repeat: int, gpus: int = 16384) -> list[dict]:
    topo, rows = preset("dgx-h100", gpus), []
    for alg in ("ring", "tree", "hierarchical", "hierarchical_2d"):
        wall, played = _best(lambda: simulate("all_reduce", alg, topo, GiB), repeat)
        rows.append({"case": f"{gpus} GPUs {alg} 1 GiB", "wall_s": wall, "goal_s": GOALS["large"],
                     "simulated_ms": played.seconds * 1e3,
                     "busbw_GBps": bandwidths("all_reduce", gpus, GiB, played.seconds)[1]})
    return rows


def auto_large(repeat: int, gpus: int = 16384) -> list[dict]:
    """"auto" at 16,384 GPUs, as `simulate collective` answers it (`simulate.auto.fastest`: only the
    candidates a lower bound does not rule out are played), at 1 MiB and 1 GiB."""
    from ringzero.simulate.auto import fastest
    topo, rows = preset("dgx-h100", gpus), []
    for size, name in ((1 << 20, "1 MiB"), (GiB, "1 GiB")):
        wall, got = _best(lambda: fastest("all_reduce", candidates("all_reduce", topo), topo, size), repeat)
        rows.append({"case": f"{gpus} GPUs auto {name} ({got.algorithm}; played {len(got.compared)})",
                     "wall_s": wall, "goal_s": GOALS["auto"], "simulated_ms": got.played.seconds * 1e3,
                     "busbw_GBps": bandwidths("all_reduce", gpus, size, got.played.seconds)[1]})
    return rows


def sweep(repeat: int, gpus: int = 1024) -> list[dict]:
    topo, rows = preset("dgx-h100", gpus), []
    for alg in [*candidates("all_reduce", topo), "auto"]:
        algs = candidates("all_reduce", topo) if alg == "auto" else [alg]

        def run():
            return [min(simulate("all_reduce", a, topo, s).seconds for a in algs) for s in SWEEP]

        wall, times = _best(run, repeat)
        rows.append({"case": f"{gpus} GPUs {alg} 8 sizes", "wall_s": wall,
                     "goal_s": GOALS["sweep"] if alg != "auto" else None,
                     "simulated_ms": times[-1] * 1e3,
                     "busbw_GBps": bandwidths("all_reduce", gpus, SWEEP[-1], times[-1])[1]})
    return rows


# (run, algorithm, the two sizes fitted, the link fitted)
PUBLISHED = ((AZURE_ND_A100_V4, "ring", (32 * MiB, 8 * GiB), "nvlink"),
             (GCP_A3_MEGA_16, "ring", (64 * MiB, 8 * GiB), "nic"),
             (GCP_A3_MEGA_16, "hierarchical_2d", (64 * MiB, 8 * GiB), "nic"))


def published() -> list[dict]:
    """Each published run against the simulator with links fitted at two of its sizes."""
    out = []
    for run, alg, at, link in PUBLISHED:
        topo = calibrate.fit(run, alg, at, link)
        rows = calibrate.compare(run, topo, alg, run.sizes(16 * MiB), at)
        bw, lat = calibrate.LINKS[link]
        out.append({"run": run.name, "source": run.source, "algorithm": alg, "fitted_at": list(at), "link": link,
                    "bandwidth_GBps": getattr(topo, bw) / 1e9, "latency_us": getattr(topo, lat) * 1e6,
                    "rows": [{"bytes": r.nbytes, "published": r.published, "simulated": r.simulated,
                              "error": r.error, "calibrated": r.calibrated} for r in rows],
                    "worst": max(abs(r.error) for r in rows if not r.calibrated),
                    "geomean": calibrate.geomean_error(rows)})
    return out


def _print_published(runs: list[dict]) -> None:
    for p in runs:
        print(f"\n{p['run']} ({p['algorithm']}; {p['link']} fitted at {p['fitted_at'][0] >> 20} MiB and "
              f"{p['fitted_at'][1] >> 20} MiB: {p['bandwidth_GBps']:.2f} GB/s, {p['latency_us']:.2f} us)")
        for r in p["rows"]:
            mark = "  (fitted)" if r["calibrated"] else ("" if abs(r["error"]) <= 0.15 else "  > 15 %")
            print(f"  {r['bytes']:>12}  published {r['published']:7.2f}  simulated {r['simulated']:7.2f}"
                  f"  {r['error']:+7.1%}{mark}")
        print(f"  worst {p['worst']:.1%}, geomean {p['geomean']:.2%} over the sizes not fitted")


SCALING = ("ring", "tree", "hierarchical", "hierarchical_2d", "rabenseifner")
LISTED_UP_TO = {"rabenseifner": 2048}


def scaling(topology: str = "dgx-h100", nbytes: int = GiB) -> dict[str, list[tuple[int, float]]]:
    """algorithm -> [(GPUs, busbw GB/s)] for 8, 16, ..., 16,384 GPUs."""
    out = {}
    for alg in SCALING:
        out[alg] = []
        for gpus in (8 << i for i in range(12)):
            if gpus <= LISTED_UP_TO.get(alg, gpus):
                played = simulate("all_reduce", alg, preset(topology, gpus), nbytes)
                out[alg].append((gpus, bandwidths("all_reduce", gpus, nbytes, played.seconds)[1]))
    return out


def plot(curves: dict, path: Path) -> None:
    loglog(curves, path, "GPUs (DGX H100 nodes of 8, rail-optimised fat tree)", "busbw (GB/s)",
           "Simulated 1 GiB all-reduce", [8, 64, 512, 4096, 16384])


def loglog(lines: dict, path: Path, xlabel: str, ylabel: str, title: str, ticks: list[int],
           dashed: tuple[str, ...] = ()) -> None:
    """One log-log line per entry of `lines` (name -> [(x, y)]), written to `path` (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in lines.items():
        ax.plot(*zip(*points), marker="o", label=name, linestyle="--" if name in dashed else "-")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="write the scaling picture here (PNG)")
    a = p.parse_args(argv)
    rows = large(a.repeat) + auto_large(a.repeat) + sweep(a.repeat)
    print(f"{'case':34} {'wall (s)':>9} {'goal':>6}  {'simulated (ms)':>14} {'busbw at the size (GB/s)':>25}")
    for r in rows:
        goal = f"<{r['goal_s']:g}" if r["goal_s"] else "-"
        mark = "" if not r["goal_s"] else ("  ok" if r["wall_s"] < r["goal_s"] else "  MISSED")
        print(f"{r['case']:34} {r['wall_s']:9.3f} {goal:>6}  {r['simulated_ms']:14.3f} {r['busbw_GBps']:25.2f}{mark}")
    runs = published()
    _print_published(runs)
    curves = scaling() if a.plot else {}
    if a.plot:
        plot(curves, a.plot)
        for alg, points in curves.items():
            print(f"busbw {alg:16}" + " ".join(f"{g}:{b:.0f}" for g, b in points))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"machine": platform.machine(), "rows": rows, "published": runs,
                                     "scaling": curves},
                                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
