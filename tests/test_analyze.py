"""`ringzero analyze`: the temporal breakdown, the straggler table and the bottleneck it names, on
real ranks' traces and reports (a 2x straggler, a pipeline of one micro-batch, a plain run), and
its bad input."""

import json
import os

import hypothesis.strategies as st
import pytest
from hypothesis import given

from ringzero import cli
from ringzero.commands import analyze_try
from ringzero.run.config import TrainConfig
from ringzero.trace import analysis, intervals
from ringzero.trace.write import write_traces
from ringzero.train.rank import train_rank
from ringzero.twin import report
from ringzero.twin import suggest
from ringzero.twin import wait as report_wait

BASE = dict(model="nano", seq=32, micro_batch=4, steps=5, max_bytes=65536, eval_every=5, eval_batches=1)
CASES = {"straggler": dict(strategy="dp", straggler=(1, 3.0)), "pipeline": dict(pp=2, layers=2, grad_accum=1),
         "plain": dict(strategy="zero2")}


def _train(group, cfg):
    return train_rank(cfg, group=group)


_RUNS: dict = {}


def _run(pool, tmp_path_factory, case):
    """(the merged trace, the JSON report as `ringzero train --json-report` writes it) of `case`."""
    if case not in _RUNS:
        folder = tmp_path_factory.mktemp(case)
        cfg = TrainConfig(**{**BASE, **CASES[case]}, trace=str(folder), trace_steps="3:5")
        results = pool.run(_train, cfg, world=2)
        write_traces(str(folder), [r.trace for r in results])
        data = report.to_json(cfg, 2, results, report.twins(cfg, 2, results))
        report_wait.into_json(data["ranks"], report_wait.render(cfg, results, _Quiet()), results)
        (folder / "report.json").write_text(json.dumps(data))
        _RUNS[case] = folder, json.loads((folder / "merged.json").read_text()), data
    return _RUNS[case]


class _Quiet:
    def print(self, *args, **kwargs):
        pass


def _names(a):
    return [b["name"] for b in a["bottlenecks"]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", ["trace", "report"])
def test_a_3x_straggler_is_named_with_its_score(pool, tmp_path_factory, source):
    _, merged, data = _run(pool, tmp_path_factory, "straggler")
    a = analysis.of_trace(merged) if source == "trace" else analysis.of_report(data)
    assert _names(a)[0] == "one slow rank" and a["bottlenecks"][0]["rank"] == 1, a["bottlenecks"]
    scores = {r["rank"]: r["score"] for r in a["ranks"]}
    assert scores[0] == 1.0 and 0.15 < scores[1] < 0.55, scores       # three times as slow: about 1/3
    # Rank 0 waits in dp's reduction for rank 1's extra 2x compute, less any noise in its own: a 3x
    # straggler (not 2x) keeps that wait above half of rank 0's compute even when the shared cores
    # slow rank 0 by half again.
    fast = next(r for r in a["ranks"] if r["rank"] == 0)
    assert set(fast["waits_s"]) == {"dp"} and fast["waits_s"]["dp"] > 0.5 * fast["compute_s"], fast


@pytest.mark.timeout(240)
@pytest.mark.parametrize("source", ["trace", "report"])
def test_a_pipeline_of_one_micro_batch_is_named_a_bubble(pool, tmp_path_factory, source):
    _, merged, data = _run(pool, tmp_path_factory, "pipeline")
    a = analysis.of_trace(merged) if source == "trace" else analysis.of_report(data)
    assert "pipeline bubble" in _names(a), a
    assert "(m = 1 micro-batches per step)" in next(b["why"] for b in a["bottlenecks"] if b["name"] == "pipeline bubble")


@pytest.mark.timeout(240)
def test_the_breakdown_adds_up_to_the_step(pool, tmp_path_factory):
    _, merged, _ = _run(pool, tmp_path_factory, "plain")
    a = analysis.of_trace(merged)
    for r in a["ranks"]:
        # compute and communication may overlap: step = compute + non-compute + idle
        assert r["compute_s"] + r["non_compute_s"] + r["idle_s"] == pytest.approx(r["step_s"], rel=1e-9)
        assert 0 <= r["overlap_ratio"] <= 1
        assert r["steps"] == 3


@pytest.mark.timeout(240)
def test_the_cli_reads_a_folder_a_rank_file_and_a_report(pool, tmp_path_factory, capsys):
    folder, _, _ = _run(pool, tmp_path_factory, "straggler")
    for path in (folder, folder / "ranks" / "rank1.json", folder / "report.json"):
        assert cli.main(["analyze", str(path)]) == 0
        out = capsys.readouterr().out
        assert "stragglers" in out and "bottleneck" in out, out
    assert cli.main(["analyze", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bottlenecks"][0]["name"] == "one slow rank"


# Two ranks of one dp step, in ms: (forward, backward, exposed communication with the wait in it,
# the wait for the last peer at its start, optimizer). Both steps last as long.
SMALL_STRAGGLER = [(10, 20, 71, 1, 1), (13, 27, 61, 0, 1)]     # rank 1 scores 0.75, costs 1 ms; 70 ms exposed
LARGE_STRAGGLER = [(10, 20, 72, 40, 1), (23, 47, 32, 0, 1)]    # rank 1 scores 0.43, costs 40 ms; 32 ms exposed


def _constructed_trace(ranks):
    events = []
    for r, (fwd, bwd, comm, wait, opt) in enumerate(ranks):
        us = lambda ms: ms * 1000
        c0, end = fwd + bwd, fwd + bwd + comm + opt
        for name, t0, t1 in (("forward", 0, fwd), ("backward", fwd, c0), ("comm", c0, c0 + comm),
                             ("optimizer", c0 + comm, end)):
            events.append({"ph": "X", "cat": "phase", "name": name, "pid": r, "tid": 1, "ts": us(t0), "dur": us(t1 - t0)})
        events += [{"ph": "X", "cat": "step", "name": "step 0", "pid": r, "tid": 1, "ts": 0, "dur": us(end)},
                   {"ph": "X", "cat": "collective", "name": "all_reduce", "pid": r, "tid": 2, "ts": us(c0),
                    "dur": us(comm), "args": {"kind": "dp", "wait for last peer (us)": us(wait)}}]
    return {"traceEvents": events, "ringzero": {"schema": 1, "world": len(ranks), "config": None}}


def _constructed_report(ranks):
    return {"world": len(ranks), "ranks": [
        {"rank": r, "step_time": (fwd + bwd + comm + opt) / 1e3,
         "phases": {"forward": fwd / 1e3, "backward": bwd / 1e3, "comm": comm / 1e3, "optimizer": opt / 1e3},
         "waiting_s": wait / 1e3, "comm_waiting_s": wait / 1e3, "waits_by_kind": {"dp": wait / 1e3} if wait else {}}
        for r, (fwd, bwd, comm, wait, opt) in enumerate(ranks)]}


@pytest.mark.parametrize("source", ["trace", "report"])
@pytest.mark.parametrize("ranks, first, costs_ms", [
    (SMALL_STRAGGLER, "exposed communication", {"exposed communication": 70, "one slow rank": 1}),
    (LARGE_STRAGGLER, "one slow rank", {"one slow rank": 40, "exposed communication": 32})])
def test_findings_rank_by_what_they_cost_of_the_step(source, ranks, first, costs_ms):
    a = analysis.of_trace(_constructed_trace(ranks)) if source == "trace" else analysis.of_report(_constructed_report(ranks))
    found = a["bottlenecks"]
    assert _names(a)[0] == first and set(_names(a)) == set(costs_ms), found
    step = a["ranks"][0]["step_s"]
    for b in found:       # the same measure for each: its seconds per step, over the step
        assert b["share"] == pytest.approx(costs_ms[b["name"]] / 1e3 / step) and b["cost_s"] == pytest.approx(b["share"] * step)
    assert [b["share"] for b in found] == sorted((b["share"] for b in found), reverse=True)


def test_the_cli_names_the_costliest_finding_the_bottleneck(tmp_path, capsys):
    from ringzero.trace.write import SCHEMA
    doc = _constructed_trace(SMALL_STRAGGLER)
    doc["ringzero"]["schema"] = SCHEMA
    (tmp_path / "small.json").write_text(json.dumps(doc))
    assert cli.main(["analyze", str(tmp_path / "small.json")]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith(("bottleneck:", "also:"))]
    assert lines[0].startswith("bottleneck: exposed communication (69% of the step, 70.0 ms)"), lines
    assert lines[1].startswith("also: one slow rank (1% of the step, 1.0 ms)"), lines


def _bad(capsys, path, *words):
    assert cli.main(["analyze", str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("ringzero: error:") and "\n" not in line, line
    for w in words:
        assert w in line, (w, line)


def test_bad_input_is_one_line(capsys, tmp_path):
    _bad(capsys, tmp_path / "missing", "does not exist")
    _bad(capsys, tmp_path, "without merged.json")
    (tmp_path / "notes.txt").write_text("hello")
    _bad(capsys, tmp_path / "notes.txt", "notes.txt", "not a ringzero report, trace or flight dump")
    (tmp_path / "other.json").write_text(json.dumps({"name": 1}))
    _bad(capsys, tmp_path / "other.json", "other.json", "not a ringzero report")
    (tmp_path / "kineto.json").write_text(json.dumps({"traceEvents": []}))
    _bad(capsys, tmp_path / "kineto.json", "not one ringzero wrote")
    (tmp_path / "old.json").write_text(json.dumps({"traceEvents": [], "ringzero": {"schema": 0}}))
    _bad(capsys, tmp_path / "old.json", "schema 0", "reads schema 1")
    (tmp_path / "empty.json").write_text(json.dumps({"traceEvents": [], "ringzero": {"schema": 1, "world": 1}}))
    _bad(capsys, tmp_path / "empty.json", "cannot read it as a ringzero trace", "no step")
    (tmp_path / "report.json").write_text(json.dumps({"schema": "ringzero.train-report/1", "twins": {}}))
    _bad(capsys, tmp_path / "report.json", "ringzero.train-report/1", "reads ringzero.train-report/2")


def _brute(spans, grid):
    return {t for t in grid if any(a <= t < b for a, b in spans)}


SPANS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)).map(sorted).map(tuple), max_size=8)


@given(SPANS, SPANS)
def test_interval_algebra_matches_counting_points(a, b):
    grid = [x / 2 for x in range(0, 82)]
    ua, ub = intervals.union(a), intervals.union(b)
    assert _brute(ua, grid) == _brute(a, grid)
    assert _brute(intervals.intersect(ua, ub), grid) == _brute(a, grid) & _brute(b, grid)
    assert _brute(intervals.minus(ua, ub), grid) == _brute(a, grid) - _brute(b, grid)
    assert intervals.length(ua) == sum(1 for t in grid if t in _brute(a, grid)) / 2


@pytest.mark.timeout(400)
def test_try_best_runs_the_baseline_and_the_change_in_turns(tmp_path, capsys, monkeypatch):
    path = tmp_path / "report.json"
    argv = ["train", "--nproc", "2", "--model", "nano", "--seq", "16", "--micro-batch", "2", "--pp", "2",
            "--layers", "2", "--grad-accum", "1", "--steps", "4", "--max-bytes", "65536", "--json-report", str(path),
            "--quiet"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    data = json.loads(path.read_text())
    assert data["argv"] == argv
    suggestions = suggest.ranked(data)
    assert suggestions[0]["why"] == "this run" and suggestions[0]["gain"] == 1.0
    best = suggestions[1]
    assert best["changes"] == {"grad_accum": 4} and best["gain"] > 1, suggestions    # m = 1 -> 4: the bubble
    assert [s["gain"] for s in suggestions[1:]] == sorted((s["gain"] for s in suggestions[1:]), reverse=True)
    data["twins"]["tokens per second"]["measured"] = 1.0     # an old figure this invocation must not divide by
    path.write_text(json.dumps(data))
    launched, main = [], cli.main

    def spy(a):          # every `ringzero train` it runs, with the report it wrote (before its folder goes)
        code = main(a)
        if a[0] == "train":
            launched.append((a[a.index("--json-report") + 1], json.loads(open(a[a.index("--json-report") + 1]).read())))
        return code
    monkeypatch.setattr(cli, "main", spy)
    assert main(["analyze", str(path), "--try-best", "--try-rounds", "2"]) == 0
    out, err = capsys.readouterr()
    configs = [done["config"] for _, done in launched]
    assert [c["grad_accum"] for c in configs] == [1, 4, 1, 4], configs       # the baseline, then the change, in turns
    assert all(c["seed"] == data["config"]["seed"] and c["steps"] == data["config"]["steps"] for c in configs)
    for report_path, _ in launched:
        assert os.path.dirname(report_path) not in out + err, out + err
    measured = [done["twins"]["tokens per second"]["measured"] for _, done in launched]
    base, new = (measured[0] + measured[2]) / 2, (measured[1] + measured[3]) / 2     # each side's median of 2
    line = next(x for x in out.splitlines() if x.startswith("tried:"))
    assert f"{base:,.0f} -> {new:,.0f}" in line and f"measured gain {new / base:.2f}x" in line, line
    assert f"predicted {best['gain']:.2f}x" in line


def test_try_rounds_is_one_or_more(capsys, tmp_path):
    assert cli.main(["analyze", str(tmp_path), "--try-best", "--try-rounds", "0"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "--try-rounds 0" in line, line


def test_try_best_needs_a_report_with_its_command_line(tmp_path, capsys, pool, tmp_path_factory):
    folder, _, _ = _run(pool, tmp_path_factory, "plain")
    _bad_try = lambda p: cli.main(["analyze", str(p), "--try-best"])
    assert _bad_try(folder) == 2 and "not a report with its command line" in capsys.readouterr().err
    assert _bad_try(folder / "report.json") == 2          # written by a test, not by ringzero train: no argv


def test_rerun_keeps_the_command_line_but_its_outputs():
    argv = ["train", "--nproc", "2", "--trace", "T", "--json-report=R", "--grad-accum", "1", "--steps", "4"]
    assert analyze_try.rerun_argv(argv, ["--grad-accum", "4"], "NEW") == [
        "train", "--nproc", "2", "--grad-accum", "1", "--steps", "4", "--grad-accum", "4", "--json-report", "NEW", "--quiet"]


@pytest.mark.timeout(240)
def test_memory_headroom_is_measured_and_named_when_short(pool, tmp_path_factory):
    _, _, data = _run(pool, tmp_path_factory, "plain")
    for r in data["ranks"]:
        m = r["memory"]
        held = sum(r["held"].values())
        assert held < m["peak_bytes"] < m["capacity_bytes"], m       # the process holds at least its states
    (host,) = analysis.of_report(data)["memory"]                     # both ranks on this host
    assert host["peak_bytes"] == sum(r["memory"]["peak_bytes"] for r in data["ranks"])
    assert "memory headroom" not in _names(analysis.of_report(data))
    short = json.loads(json.dumps(data))
    for r in short["ranks"]:
        r["memory"]["capacity_bytes"] = int(sum(x["memory"]["peak_bytes"] for x in data["ranks"]) / 0.95)
    named = analysis.of_report(short)
    assert "memory headroom" in _names(named)
    assert "5% of its memory left" in next(b["why"] for b in named["bottlenecks"] if b["name"] == "memory headroom")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["plain", "straggler"])
def test_the_planners_bucket_layout_is_the_engines(pool, tmp_path_factory, case):
    """What a larger-bucket suggestion is priced on: the layout the engine would make."""
    _, _, data = _run(pool, tmp_path_factory, case)
    cfg = TrainConfig.from_dict(data["config"])
    # the sizes (the shapes are the planner's: q, k and v apart where the engine fuses them)
    assert [(n, root) for n, root, _ in suggest.layout(cfg)] == [(b[0], b[1]) for b in data["ranks"][0]["buckets"]]
    assert any(s["changes"] == {"bucket_mb": 4 * cfg.parallel.bucket_mb} for s in suggest.ranked(data, top=20))
