"""`simulate step`: the grid's groups, concurrent groups sharing links, the step's events against
the planner's closed form and the pipeline's own simulation, stragglers, the trace, the command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ringzero import cli
from ringzero.plan.comm.schedule.build import schedule_for
from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import hardware
from ringzero.plan.model.presets import model
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.placement import Placement
from ringzero.plan.step_time import op_seconds, step_time
from ringzero.plan.strategies.traffic import data_parallel_ops
from ringzero.simulate.collective import play_schedule
from ringzero.simulate.grid import Grid, per_node
from ringzero.simulate.step import Tail, play_step
from ringzero.simulate.step_costs import Chunk, Costs
from ringzero.simulate.topology import Topology, _from, preset
from ringzero.simulate.training import simulate_step
from ringzero.trace import analysis
from ringzero.trace.validate import problems

H100 = hardware("h100-sxm")


def _topo(gpus: int, **over) -> Topology:
    return Topology(gpus=gpus, **{**_from(H100, "dgx-h100"), **over})


def test_megatron_order_gives_the_planners_groups():
    grid, place = Grid(dp=4, tp=2, pp=3), Placement(dp=4, tp=2, pp=3)
    for dim in ("tp", "dp", "pp"):
        mine = {tuple(g) for s in (range(3) if dim != "pp" else [None]) for g in grid.groups(dim, s).tolist()}
        theirs = {place.group((dim,), r) for r in range(place.world)}
        assert mine == theirs, dim
    assert [grid.gpu(**place.coords(r)) for r in range(24)] == list(range(24))


def test_other_orders_and_what_shares_a_node():
    grid = Grid(dp=4, tp=8, pp=2, order=("dp", "tp", "pp"))
    assert grid.groups("tp", 0)[0].tolist() == list(range(0, 32, 4))      # tp strided by dp: across nodes
    assert per_node(grid.groups("tp", 0), 8) == 2 and per_node(grid.groups("dp", 0), 8) == 4
    assert per_node(Grid(dp=4, tp=8, pp=2).groups("tp", 1), 8) == 8
    assert per_node(Grid(dp=16, tp=8, pp=1).groups("dp"), 8) == 1
    with pytest.raises(ValueError, match="must order each of tp, dp, pp once"):
        Grid.parse("tp,dp", 2, 2, 2)


def test_groups_played_together_share_a_nic_and_not_otherwise():
    sched = schedule_for("all_reduce", "ring", 4, 2**24, 2)
    alone = play_schedule(sched, _topo(32), np.array([[0, 8, 16, 24]])).seconds
    rails = play_schedule(sched, _topo(32), np.array([[0, 8, 16, 24], [1, 9, 17, 25]])).seconds
    assert rails == pytest.approx(alone, rel=1e-12)          # NIC 0 and NIC 1 of each node: no sharing
    shared = play_schedule(sched, _topo(32, nics_per_node=1), np.array([[0, 8, 16, 24], [1, 9, 17, 25]])).seconds
    single = play_schedule(sched, _topo(32, nics_per_node=1), np.array([[0, 8, 16, 24]])).seconds
    # two rings on one NIC per node: each gets half of it, so the bandwidth term doubles
    assert shared > 1.9 * single - 2 * sched.count * _topo(32).nic_latency


def _case(gpus, tp=1, pp=1, zero=0, **kw):
    m = model(kw.pop("model", "llama-2-7b"))
    par = Parallel(dp=gpus // (tp * pp), tp=tp, pp=pp, zero=zero, **kw)
    tr = Training(micro_batch=1, global_batch=par.dp * (4 if pp > 1 else 1))
    return m, tr, par


def test_one_node_tensor_parallel_equals_the_planner():
    m, tr, par = _case(8, tp=8)
    sim = simulate_step(m, tr, par, H100, _topo(8), Grid(par.dp, par.tp, par.pp))
    assert sim.seconds == pytest.approx(step_time(m, tr, par, H100).step, rel=0.01)


def test_a_data_parallel_bucket_on_its_own_rail_equals_the_alpha_beta_form():
    m, tr, par = _case(64, tp=8)
    from ringzero.simulate.step_costs import Player
    player = Player(_topo(64), Grid(par.dp, par.tp, par.pp), {})
    (op,) = data_parallel_ops(m, tr, par, 8, "ring")
    seconds, _ = player.collective("all_reduce", "ring", "dp", 0, op.count, op.itemsize)
    assert seconds == pytest.approx(op_seconds(op, H100), rel=0.01)


def _uniform(pp, v, f, b, send=0.0) -> Costs:
    chunk = Chunk(layers=1, forward=f / v, backward=b / v, tp_forward=0.0, tp_backward=0.0, params=0)
    return Costs(chunks=[[chunk] * v for _ in range(pp)],
                 send={(s, d): send for s in range(pp) for d in ((s + 1) % pp, (s - 1) % pp)},
                 gather=[0.0] * pp, buckets=[[[] for _ in range(v)] for _ in range(pp)], layer_gather=[0.0] * pp,
                 after=[[] for _ in range(pp)], dp_algorithm="ring")


@pytest.mark.parametrize("schedule,pp,m,v", [("gpipe", 4, 6, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 2, 1),
                                             ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3)])
def test_free_messages_replay_the_pipelines_own_schedule(schedule, pp, m, v):
    stages = play_step(_uniform(pp, v, 1.0, 2.0), pp, m, schedule, v, 0, 1, {}, Tail([0.0] * pp, 0.0))
    expected = pipeline.simulate(pp, m, schedule, v, 1.0, 2.0)
    for st, exp in zip(stages, expected):
        mine = [t for sp in st.spans if sp.name in ("forward", "backward") for t in (sp.start, sp.end)]
        assert mine == pytest.approx([t for _, s, e in exp for t in (s, e)])
        assert st.parts["pp"] == 0.0
    span = max(e for stage in expected for _, _, e in stage)
    assert max(st.end for st in stages) == pytest.approx(span)
    busy = m * 3.0            # every stage computes m forwards and backwards of 1 + 2
    assert sum(st.parts["bubble"] for st in stages) == pytest.approx(
        sum(stage[-1][2] for stage in expected) - pp * busy)


def test_messages_in_flight_are_exposed_pipeline_time():
    f, b, t = 1.0, 2.0, 0.25
    first, last = play_step(_uniform(2, 1, f, b, send=t), 2, 1, "gpipe", 1, 0, 1, {}, Tail([0.0, 0.0], 0.0))
    assert last.parts["pp"] == pytest.approx(t) and last.parts["bubble"] == pytest.approx(f)
    assert first.parts["pp"] == pytest.approx(t) and first.parts["bubble"] == pytest.approx(f + b + t)
    assert first.end == pytest.approx(2 * f + 2 * b + 2 * t)


def test_a_straggler_stretches_its_stage_and_the_job_follows_it():
    m, tr, par = _case(64, tp=8, pp=2)
    topo, grid = _topo(64), Grid(par.dp, par.tp, par.pp)
    healthy = simulate_step(m, tr, par, H100, topo, grid)
    slow_gpu = grid.gpu(tp=3, dp=2, pp=1)
    slow = simulate_step(m, tr, par, H100, topo, grid, {slow_gpu: 2.0})
    assert slow.stages[1].parts["compute"] == pytest.approx(2 * healthy.stages[1].parts["compute"])
    assert slow.seconds > healthy.seconds * 1.3


def test_tensor_parallel_across_nodes_costs_and_names_the_nic():
    m, tr, par = _case(64, tp=8)
    topo = _topo(64)
    inside = simulate_step(m, tr, par, H100, topo, Grid(par.dp, par.tp, par.pp))
    across = simulate_step(m, tr, par, H100, topo, Grid(par.dp, par.tp, par.pp, ("dp", "tp", "pp")))
    assert across.parts["tp"] > 3 * inside.parts["tp"]
    assert across.busiest(topo)[0]["link"].startswith("nic") and across.busiest(topo)[0]["kind"] == "tp"


def test_zero3_prefetch_hides_gathers():
    m, tr, par0 = _case(64, zero=3, prefetch=0)
    _, _, par1 = _case(64, zero=3, prefetch=1)
    topo, grid = _topo(64), Grid(64, 1, 1)
    none, ahead = (simulate_step(m, tr, p, H100, topo, grid) for p in (par0, par1))
    assert ahead.parts["zero_gather"] < none.parts["zero_gather"]
    assert ahead.parts["compute"] == none.parts["compute"]


def _cli(argv, capsys):
    code = cli.main(["simulate", "step", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_trace_is_valid_and_analyze_reads_its_parts(capsys, tmp_path):
    path = tmp_path / "step.json"
    code, out, err = _cli(["--model", "llama-2-7b", "--gpus", "64", "--tp", "4", "--pp", "2", "--zero", "1",
                           "--global-batch", "64", "--gpu", "h100-sxm", "--trace", str(path), "--json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    doc = json.loads(path.read_text())
    assert problems(doc) == []
    a = analysis.of_trace(doc)
    first = next(r for r in a["ranks"] if r["rank"] == 0)
    parts = res["parts_s"]
    assert first["step_s"] == pytest.approx(res["step_s"], rel=1e-6)
    assert first["bubble_s"] == pytest.approx(parts["pp"] + parts["bubble"], rel=1e-6, abs=1e-6)
    assert res["planner_step_s"] > 0 and res["busiest_links"]


def test_the_table_and_the_slowdown(capsys):
    code, out, err = _cli(["--model", "llama-2-7b", "--gpus", "16", "--tp", "8", "--gpu", "h100-sxm",
                           "--straggler", "3:1.5", "--degrade", "nic1.0:4"], capsys)
    assert code == 0, err
    assert "simulated (s)" in out and "planner (s)" in out and "slowdown" in out and "busiest link" in out


@pytest.mark.parametrize("argv,words", [
    (["--placement", "tp,pp"], "--placement"),
    (["--straggler", "99:2"], "outside the world"),
    (["--straggler", "3:0.5"], "must be >= 1"),
    (["--degrade", "nic9.0:2"], "no link"),
    (["--nic-latency", "-1"], "nic-latency"),
    (["--compress", "fp16"], "--compress"),
    (["--gpus", "12", "--tp", "4"], "whole nodes"),
    (["--nodes-per-leaf", "0"], "nodes-per-leaf"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, words):
    base = ["--model", "llama-2-7b", "--gpus", "16", "--tp", "8", "--gpu", "h100-sxm"]
    code, out, err = _cli([*base, *argv], capsys)
    assert code == 2, (out, err)
    line = err.strip()
    assert "\n" not in line and words in line, line
    assert out == ""


def test_the_presets_are_the_planners_nodes():
    for gpu, name in (("a100-80gb", "dgx-a100"), ("h100-sxm", "dgx-h100"), ("h200", "dgx-h200")):
        assert preset(name, 8) == Topology(gpus=8, **_from(hardware(gpu), name))


def test_analyze_names_the_bubble_of_a_simulated_pipeline(capsys, tmp_path):
    path = tmp_path / "bubbly.json"
    code, _, err = _cli(["--model", "llama-2-7b", "--gpus", "32", "--tp", "8", "--pp", "4", "--global-batch", "1",
                         "--gpu", "h100-sxm", "--trace", str(path), "--json"], capsys)
    assert code == 0, err
    assert cli.main(["analyze", str(path), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["bottlenecks"]
    assert found[0]["name"] == "pipeline bubble" and found[0]["share"] > 0.5
    # stages done early idle until the step ends: bubble, not communication
    assert "exposed communication" not in [b["name"] for b in found]


@pytest.mark.timeout(120)
def test_published_runs_simulated_within_5_percent_and_closer_than_the_planner():
    # Every checked case of `plan.published` on DGX A100 nodes with the planner's defaults, no
    # per-case tuning: mean 4.1 %, worst 12.6 % (BLOOM-176B: the 10 % goal is not met), against the
    # planner's 4.5 % and 13.1 %. What separates them is the pipeline's flush (the dp reduction after
    # the stage's last backward, as the engine's `reduce_now` runs it).
    from ringzero.plan.published import CASES, predicted_tflops
    a100 = hardware("a100-80gb")
    sim, plan = [], []
    for c in (c for c in CASES if c.checked):
        p = c.parallel
        got = simulate_step(c.model, c.training, p, a100, Topology(gpus=p.gpus, **_from(a100, "dgx-a100")),
                            Grid(p.dp, p.tp, p.pp))
        sim.append(abs(c.flops_per_step / (got.seconds * p.gpus) / 1e12 / c.tflops - 1))
        plan.append(abs(predicted_tflops(c, a100) / c.tflops - 1))
    assert sum(sim) / len(sim) <= 0.05
    assert sum(sim) / len(sim) < sum(plan) / len(plan)
    assert max(sim) < max(plan)
