"""`ringzero simulate step`: one training step played on a modelled cluster, beside the planner's.

    ringzero simulate step --model llama-2-70b --gpus 1024 --tp 8 --pp 8 --zero 1 --gpu h100-sxm
    ringzero simulate step --model llama-2-70b --gpus 1024 --tp 8 --pp 8 --placement dp,tp,pp
    ringzero simulate step --model gpt3-175b --gpus 1024 --tp 8 --pp 16 --straggler 17:1.5 --trace step.json
    ringzero simulate step --model llama-2-7b --gpus 64 --zero 3 --nics-per-node 1 --json

The configuration flags are `ringzero plan`'s; the cluster is the `--gpu`'s DGX node (its NVLink
and NIC figures, `--intra-bw`/`--inter-bw` overriding them), or the `--topology` preset of
`ringzero simulate collective` (whose links the planner's column then prices too), on a
rail-optimised fat tree, with the topology flags of `ringzero simulate collective`. The step is `simulate.training`'s: compute
from the planner, every collective from its schedule on the GPUs `--placement` puts it on
(fastest-varying first; Megatron-LM's tp,dp,pp by default), the pipeline's action lists and the
engine's overlap rules. It prints the step and its parts on the slowest stage against the
planner's, the busiest links, and with `--straggler`/`--degrade` the slowdown against the healthy
cluster. `--trace FILE` writes the step in `ringzero train --trace`'s format (`ringzero analyze
FILE` reads it). Every flag is checked before anything is played: one line, exit code 2.
"""

from __future__ import annotations

import json
import os

from ringzero import outputs
from ringzero.errors import usage
from ringzero.commands import plan as plan_cmd, progress
from ringzero.commands.simulate_collective import OVERRIDES, _pairs, _value, add_overrides, echoed, stragglers
from ringzero.plan.step_time import step_time
from ringzero.simulate.grid import MEGATRON, Grid
from ringzero.simulate.topology import PRESETS, Topology, _from, linked, preset_fields
from ringzero.simulate.training import as_dict, simulate_step

PLANNER_FLAGS = {"gpus-per-node": "gpus_per_node", "nvlink-bw": "intra_bw", "nic-bw": "inter_bw"}
"""Topology figures `ringzero plan`'s flags already set (--gpus-per-node, --intra-bw, --inter-bw):
topology flag -> the planner's flag (its `args` name)."""
TOPOLOGY_FLAGS = {k: v for k, v in OVERRIDES.items() if k not in PLANNER_FLAGS}
PRESET_OF = {"a100-80gb": "dgx-a100", "a100-40gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "dgx-h200"}
PARTS = {"compute": "compute", "tp": "tensor parallel (exposed)", "pp": "pipeline messages (exposed)",
         "bubble": "pipeline bubble", "zero_gather": "ZeRO-3 gathers (exposed)",
         "dp": "gradient reduction (exposed)", "optimizer": "optimizer", "offload": "offload",
         "weight_gather": "weight all-gather after the step"}


def add_arguments(parser) -> None:
    parser.description = __doc__.splitlines()[0].split(": ", 1)[1]
    plan_cmd.add_configuration(parser, plan_cmd.DEFAULT_GPU)
    g = parser.add_argument_group("cluster")
    a = g.add_argument
    a("--topology", default=None, help=f"preset: {', '.join(PRESETS)} (default: the --gpu's DGX node); "
      "its links replace the --gpu's in the planner's column too, --gpus-per-node/--intra-bw/--inter-bw override them")
    a("--placement", default=MEGATRON, help=f"tp, dp, pp fastest-varying first (default {MEGATRON}: Megatron-LM's)")
    a("--shared-nic", action="store_true", help="the node's NICs on one leaf, not one rail each")
    a("--pxn", action="store_true", help="a message between rails goes over NVLink to its rail's GPU first "
                                         "(NCCL's PXN)")
    a("--straggler", action="append", default=[], metavar="GPU:FACTOR",
      help="a GPU computing and sending FACTOR times slower (repeatable)")
    a("--degrade", action="append", default=[], metavar="LINK:FACTOR",
      help="a link (gpuG, nicJ.K, leafL) at 1/FACTOR of its capacity (repeatable)")
    add_overrides(g, TOPOLOGY_FLAGS)
    g = parser.add_argument_group("output")
    g.add_argument("--trace", metavar="FILE.json", help="write the simulated step as a Chrome trace")
    g.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    g.add_argument("--quiet", action="store_true", help=progress.QUIET_HELP)


def check(args):
    """(model, training, parallel, hardware, topology, grid, stragglers) or a ValueError naming
    the bad flag."""
    m, tr, par, hw, comp = plan_cmd.build_inputs(args)
    if comp is not None or args.servers is not None:
        raise ValueError("simulate step plays all-reduce DP and ZeRO: --compress and --servers are planned by "
                         "ringzero plan, not simulated")
    over = {field: _value(flag, kind, getattr(args, flag.replace("-", "_")))
            for flag, (field, kind, _) in TOPOLOGY_FLAGS.items() if getattr(args, flag.replace("-", "_")) is not None}
    if args.shared_nic:
        over["rail_optimized"] = False
    if args.pxn:
        over["pxn"] = True
    fields = _from(hw, PRESET_OF.get(args.gpu, args.gpu))
    if args.topology is not None:        # the preset, with the planner's flags given over it
        given = {OVERRIDES[f][0]: fields[OVERRIDES[f][0]] for f, dest in PLANNER_FLAGS.items()
                 if getattr(args, dest) is not None}
        fields = {**preset_fields(args.topology), **given}
        hw = linked(hw, fields)
    fields.update(over)
    topo = Topology(gpus=par.gpus, degrade=tuple(_pairs(args.degrade, "degrade", "LINK")), **fields)
    grid = Grid.parse(args.placement, par.dp, par.tp, par.pp)
    if args.trace is not None:
        outputs.check(args.trace, "--trace")
    return m, tr, par, hw, topo, grid, stragglers(args, topo.gpus)


def run(args) -> int:
    with usage():
        m, tr, par, hw, topo, grid, slow = check(args)
    hurt = slow or topo.degrade
    with progress.shown(args, f"simulating a step on {topo.gpus:,} GPUs", 2 if hurt else 1) as shown:
        shown.advance("the cluster as given")
        sim = simulate_step(m, tr, par, hw, topo, grid, slow)
        shown.advance("the healthy cluster")
        healthy = simulate_step(m, tr, par, hw, _healthy(topo), grid) if hurt else None
    planned = step_time(m, tr, par, hw)
    out = {**as_dict(sim, topo), "gpus": topo.gpus, "topology": topo.name, "placement": ",".join(grid.order),
           "planner_step_s": planned.step}
    if healthy is not None:
        out.update(healthy_step_s=healthy.seconds, slowdown=sim.seconds / healthy.seconds)
    if args.trace is not None:
        _write_trace(args.trace, sim, grid, topo, out)
    if args.json:
        print(json.dumps(out))
        return 0
    _render(out, planned, topo, echoed(args, ("intra-bw", "inter-bw")))
    return 0


def _healthy(topo: Topology) -> Topology:
    from dataclasses import replace
    return replace(topo, degrade=())


def _write_trace(path: str, sim, grid: Grid, topo: Topology, out: dict) -> None:
    from ringzero.trace.simulated import simulated_trace
    pids = [grid.gpu(pp=s) for s in range(grid.pp)]
    group = {"tp": grid.tp, "dp": grid.dp, "zero": grid.dp, "pp": 2}
    doc = simulated_trace([st.spans for st in sim.stages], pids, group, sim.seconds, topo.gpus,
                          {k: out[k] for k in ("gpus", "topology", "placement", "dp_algorithm")})
    outputs.write_text(path, json.dumps(doc))
    out["trace"] = os.path.abspath(path)


def _render(out: dict, planned, topo: Topology, given: str = "") -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    planner = {"compute": planned.compute, "bubble": planned.bubble, "optimizer": planned.optimizer,
               "offload": planned.offload}
    t = Table(title=f"one step on {out['gpus']:,} GPUs ({topo.name}: {topo.nodes:,} nodes of {topo.gpus_per_node}{given}), "
                    f"placement {out['placement']}, critical stage {out['critical_stage']}",
              title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("part", "simulated (s)", "share", "planner (s)"):
        t.add_column(name, justify="left" if name == "part" else "right")
    step = out["step_s"]
    for key, label in PARTS.items():
        v = out["parts_s"][key]
        if v or key in planner and planner[key]:
            t.add_row(label, f"{v:.4f}", f"{v / step:.1%}", f"{planner[key]:.4f}" if key in planner else "")
    t.add_row("exposed communication (all kinds)", f"{sum(out['parts_s'][k] for k in ('tp', 'pp', 'zero_gather', 'dp', 'weight_gather')):.4f}",
              "", f"{planned.exposed_comm:.4f}")
    t.add_row("[b]step[/b]", f"[b]{step:.4f}[/b]", "100%", f"[b]{out['planner_step_s']:.4f}[/b]")
    console = Console(width=max(Console().width, 100))
    console.print(t)
    for link in out["busiest_links"]:
        console.print(f"busiest link: {link['link']}  {link['utilisation']:.0%} of the step, mostly {link['kind']}")
    if "slowdown" in out:
        console.print(f"healthy cluster: {out['healthy_step_s']:.4f} s; slowdown {out['slowdown']:.2f}x")
    if "trace" in out:
        console.print(f"trace: {out['trace']}")
