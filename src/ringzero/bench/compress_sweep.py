"""Where gradient compression pays: DP step time with and without each scheme over the link
emulator, against the planner's break-even bandwidth.

Every rank is its own node (`--ranks-per-node 1`) joined by an emulated link of G GB/s
(`comm.link_emulator`), so every gradient byte crosses it. For each world and G the schemes run one
after another (the plain run first), the same model, seed and steps, so a shared machine's drift
hits them alike; each cell's step time is the run's median steady step.

The prediction is the planner's break-even, priced at the in-run probes' rates as every step-time
twin is (`twin.step`): each run predicts its step's communication from its probed calls under the
emulator (and the hook's compute, `train.probe_compress`); over the bandwidths, a scheme's
predictions are fitted as a + b/G, b the link's share (the bytes it carries as the emulator prices
them) and a the rest (per-message costs, the 16-bit sums, which run slower than fp32 ones on this
CPU, the hook's compute). Against the plain runs' line, compression saves (b_plain - b)/G and costs
a - a_plain, so `plan.strategies.compression.break_even_bandwidth` gives B* = (b_plain - b) /
(a - a_plain): the scheme is predicted faster exactly when G < B*. A cell's sign is right when that
agrees with the measured step times. No measured step time enters a prediction.

    python benchmarks/bench_compression.py --json out/bench_compression.json --plot out/compression.png
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from ringzero.plan.strategies.compression import break_even_bandwidth

SCHEMES = ("fp16", "bf16", "powersgd", "topk")
BANDWIDTHS = (0.05, 0.2, 0.5, 1.0, 5.0)
WORLDS = (2, 4)
RUN = ["--strategy", "dp", "--model", "nano", "--seq", "64", "--micro-batch", "2", "--steps", "12",
       "--compress-start", "2", "--ranks-per-node", "1", "--eval-every", "1000", "--eval-batches", "1"]


def run_cell(world: int, gbps: float, scheme: str, folder: str, extra: list[str]) -> dict:
    """One `ringzero train` run; its report's step time, cross-node bytes, fixed comm and probe."""
    out = os.path.join(folder, f"{world}-{gbps:g}-{scheme}.json")
    argv = [sys.executable, "-m", "ringzero.cli", "train", "--nproc", str(world), *RUN, *extra,
            "--emulate-inter-node", f"{gbps:g}", "--quiet", "--json-report", out]
    if scheme != "none":
        argv[argv.index("--compress-start"):argv.index("--compress-start")] = ["--compress", scheme]
    else:
        i = argv.index("--compress-start")
        del argv[i:i + 2]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        d = json.load(f)
    twins = d["twins"]
    return {"step_s": twins["step time"]["measured"], "cross_bytes": twins["cross-node bytes sent per step"]["predicted"],
            "cross_measured": twins["cross-node bytes sent per step"]["measured"],
            "predicted_step_s": twins["step time"]["predicted"],
            "comm_s": twins["exposed communication per step"]["predicted"],
            "compute_s": d["probe"].get("compress_s", 0.0),
            "final_loss": d["losses"][-1]}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares of seconds = a + b / bandwidth over (bytes/s, seconds) points: (a, b)."""
    xs, ys = [1.0 / g for g, _ in points], [y for _, y in points]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if n > 1 and sxx else 0.0
    return my - b * mx, b


def break_even(cells: dict, world: int, scheme: str) -> float | None:
    """B* of `scheme` on `world` ranks (bytes/s), from the predicted communication of its runs and the
    plain runs at every bandwidth: each fitted as a + b/G (a: what does not depend on the link, the
    hook's compute included; b: the bytes the link carries, as the emulator prices them)."""
    def line(s):
        return fit([(g * 1e9, c["comm_s"]) for (w, g, name), c in cells.items() if w == world and name == s])
    (a_p, b_p), (a_c, b_c) = line("none"), line(scheme)
    return break_even_bandwidth(b_p, b_c, a_c - a_p)


def judge(cells: dict) -> list[dict]:
    """Each (world, G, scheme) cell beside its plain run: measured speed-up, B*, the predicted and
    measured signs."""
    rows, stars = [], {}
    for (world, gbps, scheme), c in cells.items():
        if scheme == "none":
            continue
        p = cells[(world, gbps, "none")]
        b_star = stars.setdefault((world, scheme), break_even(cells, world, scheme))
        predicted_faster = b_star is not None and gbps * 1e9 < b_star
        faster = c["step_s"] < p["step_s"]
        rows.append({"world": world, "gbps": gbps, "scheme": scheme, "plain_step_s": p["step_s"],
                     "step_s": c["step_s"], "speedup": p["step_s"] / c["step_s"],
                     "break_even_gbps": None if b_star is None else b_star / 1e9,
                     "predicted_faster": predicted_faster, "faster": faster, "right": predicted_faster == faster,
                     "final_loss": c["final_loss"], "plain_final_loss": p["final_loss"],
                     "cell": c, "plain_cell": p})
    return rows


def sweep(worlds=WORLDS, bandwidths=BANDWIDTHS, schemes=SCHEMES, extra: list[str] | None = None) -> list[dict]:
    cells = {}
    with tempfile.TemporaryDirectory() as folder:
        for world in worlds:
            for g in bandwidths:
                for s in ("none", *schemes):
                    cells[(world, g, s)] = run_cell(world, g, s, folder, extra or [])
                    print(f"world {world}, {g:g} GB/s, {s}: {cells[(world, g, s)]['step_s'] * 1e3:.1f} ms", flush=True)
    return judge(cells)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    worlds = sorted({r["world"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4), squeeze=False)
    for ax, world in zip(axes[0], worlds):
        mine = [r for r in rows if r["world"] == world]
        gs = sorted({r["gbps"] for r in mine})
        plain = [next(r["plain_step_s"] for r in mine if r["gbps"] == g) * 1e3 for g in gs]
        ax.plot(gs, plain, "k-o", label="none")
        for s in sorted({r["scheme"] for r in mine}):
            ax.plot(gs, [next(r["step_s"] for r in mine if r["gbps"] == g and r["scheme"] == s) * 1e3 for g in gs],
                    "-o", label=s)
        ax.set_xscale("log")
        ax.set_xlabel("emulated link bandwidth (GB/s)")
        ax.set_ylabel("DP step time (ms)")
        ax.set_title(f"{world} ranks, one per node")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def render(rows: list[dict]) -> str:
    lines = ["| world | GB/s | scheme | step (ms) | plain (ms) | speed-up | B* (GB/s) | predicted | measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = "never" if r["break_even_gbps"] is None else f"{r['break_even_gbps']:.3g}"
        lines.append(f"| {r['world']} | {r['gbps']:g} | {r['scheme']} | {r['step_s'] * 1e3:.1f} | "
                     f"{r['plain_step_s'] * 1e3:.1f} | {r['speedup']:.2f} | {b} | "
                     f"{'faster' if r['predicted_faster'] else 'slower'} | {'faster' if r['faster'] else 'slower'} |")
    right = sum(r["right"] for r in rows)
    lines.append(f"\nsign predicted right in {right} of {len(rows)} cells ({right / len(rows):.0%})")
    return "\n".join(lines)
