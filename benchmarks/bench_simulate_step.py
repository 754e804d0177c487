"""`ringzero simulate step` at scale: its speed, what a placement costs, its fidelity on published
runs, and step time against GPUs.

- Speed: a 1,024-GPU 3D step of llama-2-70b (tp 8, pp 8, dp 16, ZeRO-1) played end to end, best
  of `--repeat` (goal: under 10 s on this 2-core machine), and the same at 16,384 GPUs.
- Placement: that step with each order of tp, dp, pp (fastest first): Megatron-LM's tp,dp,pp keeps
  each tp group inside a node; the others spread it, or the pipeline, over the NICs.
- Fidelity: every case of `plan.published` (Megatron-LM's Table 1, BLOOM-176B, MT-NLG) simulated on
  DGX A100 nodes with the planner's defaults, teraFLOP/s per GPU against the published figure,
  beside the planner's closed form.
- `--plot`: step time of llama-2-70b (tp 8, pp 8, ZeRO-1, global batch 1,024) from 64 to 16,384
  GPUs on DGX H100 nodes, simulated and planned, Megatron's placement and tp across nodes.

    .venv/bin/python benchmarks/bench_simulate_step.py [--repeat 3] [--json out/bench_simulate_step.json]
                                                       [--plot docs/simulate-step-scaling.png]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_simulate import loglog

from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import hardware
from ringzero.plan.model.presets import model
from ringzero.plan.published import CASES, predicted_tflops
from ringzero.plan.step_time import step_time
from ringzero.simulate.grid import Grid
from ringzero.simulate.topology import Topology, _from
from ringzero.simulate.training import simulate_step

H100, A100 = hardware("h100-sxm"), hardware("a100-80gb")
GOAL_S = 10.0
ORDERS = ("tp,dp,pp", "tp,pp,dp", "dp,tp,pp", "pp,tp,dp")


def llama70b(gpus: int, order: str = "tp,dp,pp"):
    m = model("llama-2-70b")
    par = Parallel(dp=gpus // 64, tp=8, pp=8, zero=1)
    tr = Training(micro_batch=1, global_batch=1024)
    topo = Topology(gpus=gpus, **_from(H100, "dgx-h100"))
    return m, tr, par, topo, Grid.parse(order, par.dp, par.tp, par.pp)


def speed(repeat: int) -> list[dict]:
    rows = []
    for gpus in (1024, 16384):
        m, tr, par, topo, grid = llama70b(gpus)
        best, sim = float("inf"), None
        for _ in range(repeat):
            t = time.perf_counter()
            sim = simulate_step(m, tr, par, H100, topo, grid)
            best = min(best, time.perf_counter() - t)
        rows.append({"gpus": gpus, "wall_s": best, "step_s": sim.seconds, "goal_s": GOAL_S if gpus == 1024 else None})
    return rows


def placements() -> list[dict]:
    rows = []
    for order in ORDERS:
        m, tr, par, topo, grid = llama70b(1024, order)
        sim = simulate_step(m, tr, par, H100, topo, grid)
        link = sim.busiest(topo, 1)[0]
        rows.append({"placement": order, "step_s": sim.seconds, **{k: sim.parts[k] for k in ("tp", "pp", "bubble", "dp")},
                     "busiest": link["link"], "busiest_kind": link["kind"], "utilisation": link["utilisation"]})
    return rows


def fidelity() -> list[dict]:
    rows = []
    for c in CASES:
        p = c.parallel
        sim = simulate_step(c.model, c.training, p, A100, Topology(gpus=p.gpus, **_from(A100, "dgx-a100")),
                            Grid(p.dp, p.tp, p.pp))
        tflops = c.flops_per_step / (sim.seconds * p.gpus) / 1e12
        rows.append({"case": c.name, "checked": c.checked, "published": c.tflops, "simulated": tflops,
                     "sim_error": (tflops - c.tflops) / c.tflops, "planned": predicted_tflops(c, A100),
                     "plan_error": (predicted_tflops(c, A100) - c.tflops) / c.tflops})
    return rows


def curves() -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list] = {"simulated, Megatron placement": [], "planner": [], "simulated, tp across nodes": []}
    for gpus in (64 << i for i in range(9)):
        m, tr, par, topo, grid = llama70b(gpus)
        out["simulated, Megatron placement"].append((gpus, simulate_step(m, tr, par, H100, topo, grid).seconds))
        out["planner"].append((gpus, step_time(m, tr, par, H100).step))
        across = Grid.parse("dp,tp,pp", par.dp, par.tp, par.pp)
        if par.dp > 1:
            out["simulated, tp across nodes"].append((gpus, simulate_step(m, tr, par, H100, topo, across).seconds))
    return out


def plot(lines: dict, path: Path) -> None:
    loglog(lines, path, "GPUs (DGX H100 nodes of 8)", "step time (s)",
           "llama-2-70b, tp 8 x pp 8, ZeRO-1, global batch 1,024", [64, 256, 1024, 4096, 16384], ("planner",))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="write step time against GPUs here (PNG)")
    a = p.parse_args(argv)
    out = {"speed": speed(a.repeat), "placements": placements(), "fidelity": fidelity()}
    for r in out["speed"]:
        mark = "" if r["goal_s"] is None else ("  ok" if r["wall_s"] < r["goal_s"] else "  MISSED")
        print(f"llama-2-70b step on {r['gpus']:,} GPUs: simulated in {r['wall_s']:.3f} s "
              f"(step {r['step_s']:.3f} s){mark}")
    print("\n| placement (fastest first) | step (s) | tp exposed (s) | pp exposed (s) | bubble (s) | busiest link |")
    print("|---|---:|---:|---:|---:|---|")
    for r in out["placements"]:
        print(f"| {r['placement']} | {r['step_s']:.3f} | {r['tp']:.3f} | {r['pp']:.3f} | {r['bubble']:.3f} | "
              f"{r['busiest']} ({r['busiest_kind']}, {r['utilisation']:.0%}) |")
    print("\n| case | published | simulated | error | planner | error |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in out["fidelity"]:
        note = "" if r["checked"] else " (not in the bound)"
        print(f"| {r['case']}{note} | {r['published']:g} | {r['simulated']:.1f} | {r['sim_error']:+.1%} | "
              f"{r['planned']:.1f} | {r['plan_error']:+.1%} |")
    checked = [r for r in out["fidelity"] if r["checked"]]
    for key, who in (("sim_error", "simulated"), ("plan_error", "planner")):
        errors = [abs(r[key]) for r in checked]
        print(f"{who}: mean absolute error {sum(errors) / len(errors):.1%}, worst {max(errors):.1%} "
              f"over the {len(checked)} checked cases")
    if a.plot:
        lines = curves()
        plot(lines, a.plot)
        out["curves"] = lines
        for name, points in lines.items():
            print(f"{name:32}" + " ".join(f"{g}:{s:.2f}" for g, s in points))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
