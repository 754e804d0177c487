"""The report's time twins and what every report says, in every feature:

- an injected straggler's extra compute is in the predicted step, and the table's phases add up to
  the step (its own row for the straggler's extra compute, "rest of the step" for the remainder,
  taken per step and then its median, never negative);
- the table of ranks' "exposed communication" is the twin table's, under tensor parallelism too;
- the cross-node byte twins appear with `--comm-algorithm auto` on emulated nodes, whatever it picks
  (`plan.comm.links` models the trees and the recursive algorithms);
- every JSON report (the parameter server's too) opens with the same schema, losses with their
  first step, and validation losses as [{"step", "loss"}]; tokens/s counts this run's steps only;
- the validation loss is compared with a uniform guess over the model's vocabulary;
- `--layout auto` says which hardware it planned for and the runner-up's predicted step.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from ringzero import cli
from ringzero.comm.timeline import CallRecord, Timeline
from ringzero.plan.comm import links
from ringzero.plan.comm.algorithms import ALGORITHMS
from ringzero.twin import step as predict_step
from ringzero.twin import report
from ringzero.twin import wait as report_wait
from ringzero.twin import zero as report_zero
from ringzero.run.config import TrainConfig
from ringzero.train.engine import RankResult
from ringzero.train.rank import train_rank
from ringzero.train.steps import summarise

from test_links import _prefix, _flatten

BASE = dict(model="nano", seq=32, micro_batch=2, eval_every=1000, eval_batches=1, max_bytes=1 << 16)
QUICK = ["--seq", "16", "--micro-batch", "1", "--max-bytes", "65536", "--eval-every", "1000", "--eval-batches", "1"]
RATES = {"flops": 1e9, "optimizer_s_per_param": 1e-8}


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"))


# -- the straggler in the step ---------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["dp", "zero2", "zero3"])
def test_the_straggler_extra_compute_is_in_the_predicted_step(strategy):
    """(factor - 1) x the straggler's compute, once, on top of the step without it, whichever rank."""
    plain = TrainConfig(strategy=strategy, **BASE)
    slow = TrainConfig(strategy=strategy, straggler=(1, 3.0), **BASE)
    buckets = [(100_000, True), (200_000, False)]
    for rank in (0, 1):
        a = predict_step.step_seconds(plain, 2, buckets, RATES, rank=rank)
        b = predict_step.step_seconds(slow, 2, buckets, RATES, rank=rank)
        assert a["straggler"] == 0.0
        assert b["straggler"] == pytest.approx(2.0 * b["compute"])
        assert b["step"] == pytest.approx(a["step"] + 2.0 * a["compute"])
        assert b["step"] == pytest.approx(b["compute"] + b["straggler"] + b["comm"] + b["optimizer"])


def _train(group, cfg):
    return train_rank(cfg, group=group)


def _measure(group, cfg):
    return train_rank(cfg, group=group, calibrate=False)


def _phases(rows: list[report.Twin]) -> list[report.Twin]:
    names = [t.name for t in rows]
    return rows[names.index("compute per step"):names.index(report.REST) + 1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["dp", "zero2"])
def test_a_straggler_run_predicts_its_step_and_its_phases_add_up(pool, strategy):
    # 5x: the straggler's extra compute (4 computes) dominates its step; without it in the
    # prediction the step was predicted at a fifth of what it measures. Sequence 128: at 32 a step's
    # compute (~25 ms) is mostly per-call overhead the block's rate does not see (compute +40 % with
    # no straggler at all), which left the step error at +30 to +63 %.
    cfg = TrainConfig(strategy=strategy, straggler=(1, 5.0), steps=8, **{**BASE, "seq": 128})
    results = pool.run(_train, cfg, world=2)
    rows = report.twins(cfg, 2, results)
    by = {t.name: t for t in rows}
    assert report.shown_rank(cfg, results) == 1
    phases, step = _phases(rows), by["step time"]
    assert any(t.name.startswith("straggler's extra compute") for t in phases)
    assert sum(t.predicted for t in phases) == pytest.approx(step.predicted)
    # medians of the rows: they add up to each step, to the median step only about
    assert sum(t.measured for t in phases) == pytest.approx(step.measured, rel=0.15)
    rest = by[report.REST].measured
    assert 0 <= rest < 0.15 * step.measured, (rest, step.measured)      # the phases hold the step
    # Without the straggler's term the step is predicted at a fifth (error +400 %); with it, a quiet
    # machine measures +5 to +40 %, and the busy core of a full suite run has measured +56 %.
    assert abs(step.error) < 1.0, (step.predicted, step.measured)


class _Layout:
    def layout(self):
        return []


def test_the_rest_of_the_step_is_each_steps_rest_then_its_median():
    """Medians do not add: steps whose forward and optimizer ran long in turn put the phases'
    medians (6 + 6 ms) past the median step (9.5 ms), which left a rest of -2.5 ms; per step it is
    0.5 ms each time."""
    warm = [dict(forward=1e-3, backward=0.0, comm=0.0, optimizer=0.0, pipeline_wait=0.0, straggler=0.0)] * 2
    steady = [dict(warm[0], forward=f * 1e-3, optimizer=o * 1e-3) for f, o in ((6, 3), (3, 6), (6, 6))]
    res = RankResult(rank=0, calls=[Timeline()] * 5, compress_s=[None] * 5)
    summarise(res, [2e-3, 2e-3, 9.5e-3, 9.5e-3, 12.5e-3], warm + steady, _Layout())
    assert res.step_time == pytest.approx(9.5e-3)
    rows = report.phase_twins(TrainConfig(**BASE), res, dict(compute=0.0, comm=0.0, optimizer=0.0))
    assert rows[-1].name == report.REST and rows[-1].measured == pytest.approx(0.5e-3)


# -- the table of ranks' communication -------------------------------------------------------------

def _rank(rank: int, comm: float, log: Timeline) -> RankResult:
    ph = dict(forward=0.1, backward=0.2, comm=comm, optimizer=0.01, straggler=0.0, pipeline_wait=0.0)
    return RankResult(rank=rank, phases=ph, calls=[log], step_time=0.35)


def _logs(blocked: list[tuple[float, float]]) -> list[Timeline]:
    """Rank 1 arrives 40 ms after rank 0 at an all-reduce made on the computing thread."""
    logs = [Timeline(), Timeline()]
    logs[0].calls = [CallRecord("all_reduce", (0, 1), 0, start=0.00, end=0.05)]
    logs[1].calls = [CallRecord("all_reduce", (0, 1), 0, start=0.04, end=0.05)]
    logs[0].blocked = blocked
    return logs


def test_the_ranks_exposed_communication_is_the_twin_tables_under_tensor_parallelism():
    """A tp collective's wait inside forward is waiting, not taken out of the exposed communication."""
    cfg = TrainConfig(tp=2, **BASE)
    rs = [_rank(i, 0.03, log) for i, log in enumerate(_logs([]))]
    rows = report_wait.render(cfg, rs, _quiet())
    assert rows[0]["waiting_s"] == pytest.approx(0.04)
    for row, r in zip(rows, rs):
        assert row["comm_s"] == r.phases["comm"] == 0.03       # the twin table's measured figure
        assert row["comm_waiting_s"] == 0.0


def test_the_wait_inside_the_comm_phase_is_shown_as_part_of_it():
    cfg = TrainConfig(**BASE)
    rs = [_rank(i, 0.06, log) for i, log in enumerate(_logs([(0.0, 0.06)]))]
    rows = report_wait.render(cfg, rs, _quiet())
    assert rows[0]["comm_s"] == 0.06 and rows[0]["comm_waiting_s"] == pytest.approx(0.04)
    assert rows[1]["comm_waiting_s"] == 0.0


# -- cross-node bytes whatever auto picks ----------------------------------------------------------

def test_the_trees_and_recursive_algorithms_have_a_cross_node_model():
    cases = {(c, a) for c in ALGORITHMS for a in links.modelled(c)}
    assert {("all_reduce", "tree"), ("all_reduce", "butterfly"), ("all_reduce", "rabenseifner"),
            ("all_gather", "recursive_doubling"), ("reduce_scatter", "recursive_halving"),
            ("broadcast", "scatter_allgather"), ("gather", "tree"), ("scatter", "tree")} <= cases


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world,rpn", [(3, 2), (6, 4), (5, 2)])
def test_meter_cross_node_bytes_equal_plan_beyond_powers_of_two(pool, world, rpn):
    """MPICH's fold (ranks beyond the largest power of two) and trees cut short, on nodes."""
    bad = _flatten(pool.run(_prefix, rpn, world=world, timeout=60))
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["dp", "zero2"])
def test_cross_node_twins_appear_with_auto(pool, strategy):
    cfg = TrainConfig(strategy=strategy, ranks_per_node=2, steps=2, **BASE)
    assert cfg.parallel.comm_algorithm == "auto"
    results = pool.run(_measure, cfg, world=4)
    rows = {t.name: t for t in report_zero.link_twins(cfg, 4, results)}
    assert set(rows) == {"cross-node bytes sent per step", "intra-node bytes sent per step"}
    for t in rows.values():
        assert t.measured == t.predicted, t
    assert rows["cross-node bytes sent per step"].measured > 0


# -- the JSON reports ------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_the_parameter_server_report_has_the_schema_and_shapes_of_every_report(capsys, tmp_path):
    out = tmp_path / "ps.json"
    code = cli.main(["train", "--nproc", "2", "--strategy", "ps", "--servers", "1", *QUICK, "--steps", "2",
                     "--eval-every", "2", "--json-report", str(out), "--quiet"])
    text = " ".join(capsys.readouterr().out.split())        # rich wraps long lines
    assert code == 0, text
    d = json.loads(out.read_text())
    assert d["schema"] == report.SCHEMA and d["world"] == 3 and d["first_step"] == 0
    assert len(d["losses"]) == 2 and [set(v) for v in d["val"]] == [{"step", "loss"}] and d["val"][0]["step"] == 2
    assert "uniform over the model's vocabulary of 256: ln 256 = 5.545" in text


def _save_then_resume(group, first, second):
    train_rank(first, group=group, calibrate=False)
    return train_rank(second, group=group, calibrate=False)


@pytest.mark.timeout(300)
def test_a_resumed_runs_losses_carry_their_first_step(pool, tmp_path):
    first = TrainConfig(steps=4, save_every=2, save_dir=str(tmp_path), **BASE)
    second = TrainConfig(steps=6, resume=str(tmp_path), **BASE)
    results = pool.run(_save_then_resume, first, second, world=2)
    head = report.header(second, 2, results)
    assert head["first_step"] == 4 and len(head["losses"]) == 2 and head["schema"] == report.SCHEMA


def test_tokens_per_second_counts_only_the_steps_this_run_ran(monkeypatch, capsys):
    """A run resumed at step 20: its first step is one step's tokens over the time it took."""
    from ringzero.commands import train_log
    clock = iter([100.0, 101.0, 102.0])
    monkeypatch.setattr(train_log.time, "perf_counter", lambda: next(clock))
    cfg = TrainConfig(steps=30, log_every=1, **BASE)
    cb = train_log.StepCallback(cfg, 2, show=True)
    res = RankResult(rank=0, losses=[3.0])
    tokens = cfg.global_batch(2) * cfg.shape.seq
    cb(20, res)
    cb(21, res)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 21/30") and f"{tokens:,.0f} tokens/s" in lines[0], lines
    assert f"{tokens:,.0f} tokens/s" in lines[1], lines           # two steps in two seconds


# -- the loss's baseline, and the auto layout's line -----------------------------------------------

def test_the_validation_loss_is_compared_with_the_models_vocabulary():
    line = report.validation_line(TrainConfig(model="gpt2"), [(10, 7.5)])
    assert line.startswith("validation loss: step 10: 7.500")
    assert "vocabulary of 50,257: ln 50,257 = 10.825" in line and "256 byte values: ln 256 = 5.545" in line
    assert "ln 256 = 5.545" in report.validation_line(TrainConfig(model="nano"), [])


@pytest.mark.timeout(120)
def test_layout_auto_says_what_it_planned_for_and_the_runner_up(capsys):
    code = cli.main(["train", "--nproc", "2", "--layout", "auto", "--steps", "1", *QUICK, "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    line = out[out.index("layout auto:"):]
    assert "planned for 2 x a100-80gb" in line and "runner-up's" in line and "ms" in line, line


def test_the_report_names_the_terms_it_does_not_price():
    """Contention for cores the probe cannot see: ZeRO-3's gathers beside compute; none for plain
    dp, and none for a straggler (priced at its share of the cores: `predict_straggler`)."""
    from ringzero.run.config import TrainConfig
    from ringzero.twin.step import unpriced
    assert unpriced(TrainConfig(strategy="dp", straggler=(1, 2.0)), 4, 2) == []
    (line,) = unpriced(TrainConfig(strategy="zero3"), 2, 2)
    assert "all-gathers" in line
    assert unpriced(TrainConfig(strategy="dp"), 4, 2) == []
