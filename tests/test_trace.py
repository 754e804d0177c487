"""`ringzero train --trace`: the traces a run writes, checked against a strict reader of the format
and against the run's own measurements (the trace's twins), and the merged clock against a known
injected delay."""

import json
import time

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import clock, timeline
from ringzero.plan.comm.volume import Volume
from ringzero.run.config import TrainConfig
from ringzero.trace import merge
from ringzero.trace.validate import problems
from ringzero.trace.write import write_traces
from ringzero.twin import kinds as report_kinds
from ringzero.twin import predict
from ringzero.train.rank import train_rank

from cli_errors import forbid_ranks, train_fails

BASE = dict(model="nano", seq=16, micro_batch=1, steps=5, max_bytes=65536, eval_every=4, eval_batches=1)
CASES = {"zero2": dict(strategy="zero2", grad_accum=2), "tp-sp": dict(tp=2, sequence_parallel=True, strategy="zero1"),
         "pp": dict(pp=2, layers=2, grad_accum=2, strategy="dp"), "zero3": dict(strategy="zero3"),
         "dp-tp": dict(tp=2, sequence_parallel=True, strategy="zero1")}
WORLD = {"dp-tp": 4}
"""Ranks per case (2 unless named): dp-tp is dp 2 × tp 2."""


def _traced(group, cfg):
    r = train_rank(cfg, group=group, calibrate=False)
    return {"trace": r.trace, "kinds": r.kinds, "traffic": r.traffic, "rank": r.rank, "buckets": r.buckets,
            "sp_elements": r.sp_elements}


_RUNS: dict = {}


def _run(pool, tmp_path_factory, case):
    if case not in _RUNS:
        folder = tmp_path_factory.mktemp(case)
        cfg = TrainConfig(**{**BASE, **CASES[case]}, trace=str(folder), trace_steps="2:4")
        results = pool.run(_traced, cfg, world=WORLD.get(case, 2))
        write_traces(str(folder), [r["trace"] for r in results])
        _RUNS[case] = folder, results
    return _RUNS[case]


def _load(folder, name):
    """`merged`, or a rank's file ("rank1"), from their folder (`trace.write`)."""
    return json.loads((folder / ("" if name == "merged" else "ranks") / f"{name}.json").read_text())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES)
def test_traces_are_valid_and_hold_every_phase(pool, tmp_path_factory, case):
    folder, _ = _run(pool, tmp_path_factory, case)
    for name in ("rank0", "rank1", "merged"):
        doc = _load(folder, name)
        assert problems(doc) == [], name
        assert doc["distributedInfo"]["world_size"] == WORLD.get(case, 2)
    merged = _load(folder, "merged")
    names = {(e["ph"], e.get("cat"), e["name"]) for e in merged["traceEvents"]}
    for phase in ("forward", "backward"):
        assert ("X", "phase", phase) in names
    assert sum(e["ph"] == "X" and e.get("cat") == "step" for e in merged["traceEvents"]) == WORLD.get(case, 2) * 3
    assert any(e["ph"] == "s" for e in merged["traceEvents"]), "no flow joins a collective across ranks"
    if case == "pp":
        assert {e["ph"] for e in merged["traceEvents"] if e.get("cat") == "p2p"} == {"b", "e"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES)
def test_trace_bytes_equal_the_meters_and_phases_sum_to_the_engines(pool, tmp_path_factory, case):
    folder, _ = _run(pool, tmp_path_factory, case)
    for rank in range(WORLD.get(case, 2)):
        doc = _load(folder, f"rank{rank}")
        events = doc["traceEvents"]
        sent = sum(e["args"]["bytes sent"] for e in events if e.get("cat") == "collective")
        sent += sum(e["args"].get("bytes_sent", 0) for e in events if e.get("cat") == "p2p" and e["ph"] == "b")
        meter = sum((Volume(**op) for op in doc["ringzero"]["meter"]["ops"].values()), Volume())
        assert sent == meter.bytes_sent > 0
        for step in doc["ringzero"]["steps"]:
            inside = [e for e in events if e.get("cat") == "phase" and e["ph"] == "X"
                      and step["start"] * 1e6 - 1 <= e["ts"] <= step["end"] * 1e6 + 1]
            for name, seconds in step["phases"].items():
                mine = [e for e in inside if e["name"] == name]
                # a phase's own time: its span less the phase spans inside it (the norm's all-reduce in the optimizer)
                own = sum(e["dur"] for e in mine) - sum(c["dur"] for e in inside if e["name"] != name for c in [e]
                                                        if any(m["ts"] <= c["ts"] and c["ts"] + c["dur"] <= m["ts"] + m["dur"]
                                                               for m in mine))
                assert own / 1e6 == pytest.approx(seconds, abs=1e-6 * (1 + len(mine))), (step["step"], name)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES)
def test_every_byte_of_the_measured_step_has_a_kind(pool, tmp_path_factory, case):
    _, results = _run(pool, tmp_path_factory, case)
    for r in results:
        metered = sum((Volume(**op) for op in r["traffic"]["ops"].values()), Volume())
        kinds = {k: Volume(**v) for k, v in r["kinds"].items()}
        assert sum(kinds.values(), Volume()).bytes_sent == metered.bytes_sent
        assert sum(kinds.values(), Volume()).bytes_recv == metered.bytes_recv
        assert "other" not in kinds, kinds
        expect = {"zero2": {"dp", "zero_gather"}, "tp-sp": {"tp", "sp", "norm"},
                  "pp": {"pp", "embedding", "norm"}, "zero3": {"dp", "zero_gather"},
                  "dp-tp": {"dp", "zero_gather", "tp", "sp", "norm"}}[case]
        assert expect <= {k for k, v in kinds.items() if v.bytes_sent}, kinds


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES)
def test_the_planner_predicts_every_kinds_bytes_exactly(pool, tmp_path_factory, case):
    """The report's per-kind twins: predicted == measured for every kind, sent and received."""
    _, results = _run(pool, tmp_path_factory, case)
    cfg, world = TrainConfig(**{**BASE, **CASES[case]}), WORLD.get(case, 2)
    for r in results:
        want = {k: v for k, v in predict.traffic_by_kind(cfg, world, r["buckets"], r["rank"], r["sp_elements"]).items()
                if v.bytes_sent or v.bytes_recv}
        got = {k: Volume(**v) for k, v in r["kinds"].items() if v["bytes_sent"] or v["bytes_recv"]}
        assert {k: (v.bytes_sent, v.bytes_recv) for k, v in got.items()} == \
            {k: (v.bytes_sent, v.bytes_recv) for k, v in want.items()}, r["rank"]
    rows = {t.name: t for t in report_kinds.twins(cfg, world, [_Result(r) for r in results])}
    assert len(rows) >= 2 and all(t.error == 0 for t in rows.values()), rows


class _Result:
    """The fields of a `RankResult` the kind twins read, from a traced run's plain data."""
    def __init__(self, r: dict) -> None:
        self.__dict__.update(r)


def _delayed(group, delay_s):
    """Rank 1 enters an all-reduce `delay_s` after rank 0; the traced data of both, as a Tracer's."""
    start = {"at": time.time(), "offsets": clock.offsets(group)}
    with timeline.Timeline() as log:
        dist.barrier(group=group)
        if dist.get_rank(group) == 1:
            time.sleep(delay_s)
        comm.all_reduce(torch.ones(4), group=group, algorithm="ring")
    end = {"at": time.time(), "offsets": clock.offsets(group)}
    return {"rank": dist.get_rank(group), "clock": {"start": start, "end": end},
            "calls": [dict(vars(c), ranks=list(c.ranks)) for c in log.calls]}


@pytest.mark.timeout(120)
def test_the_merged_clock_shows_an_injected_delay_as_the_others_wait(pool):
    datas = pool.run(_delayed, 0.05, world=2)
    waited = merge.waits(datas)
    wait0 = next(iter(waited[0].values()))
    # on one host both ranks read one clock: the true gap is the difference of their raw starts
    true = datas[1]["calls"][0]["start"] - datas[0]["calls"][0]["start"]
    assert true >= 0.05
    assert wait0 == pytest.approx(true, abs=1e-3)
    assert next(iter(waited[1].values())) < 1e-3
    assert merge.alignment(datas)["alignment_error_us"] < 1000


@pytest.mark.parametrize("argv,words", [
    (["--trace-steps", "3:2", "--trace", "T"], ("trace_steps", "reversed")),
    (["--trace-steps", "0:2", "--trace", "T"], ("trace_steps", "1 <= A")),      # numbered from 1, as the progress line
    (["--trace-steps", "2:9", "--trace", "T", "--steps", "4"], ("trace_steps", "outside", "<= 4")),
    (["--trace-steps", "a:b", "--trace", "T"], ("trace_steps", "A:B")),
    (["--trace-steps", "1:2"], ("trace_steps", "--trace DIR")),
    (["--trace", "FILE"], ("--trace", "is a file")),
    (["--trace", "missing/deeper"], ("--trace", "does not exist")),
    (["--profile", "FILE"], ("--profile", "is a file")),
])
def test_bad_trace_input_is_one_line_before_any_rank(capsys, tmp_path, monkeypatch, argv, words):
    forbid_ranks(monkeypatch)
    (tmp_path / "FILE").write_text("x")
    argv = [str(tmp_path / a) if a in ("T", "FILE", "missing/deeper") else a for a in argv]
    train_fails(capsys, tmp_path, ["--model", "nano", *argv], *words)


def _traced_ps(group, cfg):
    r = train_rank(cfg, group=group)
    return {"role": r.role, "trace": r.trace}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_parameter_servers_workers_are_traced_and_their_bytes_are_the_meters(pool, tmp_path, mode):
    cfg = TrainConfig(**BASE, strategy="ps", servers=1, ps_mode=mode, trace=str(tmp_path), trace_steps="2:4")
    results = pool.run(_traced_ps, cfg, world=3)
    assert [r["trace"] is not None for r in results] == [r["role"] == "worker" for r in results] == [True, True, False]
    write_traces(str(tmp_path), [r["trace"] for r in results if r["trace"]])
    for name in ("rank0", "rank1", "merged"):
        assert problems(_load(tmp_path, name)) == [], name
    for rank in (0, 1):
        doc = _load(tmp_path, f"rank{rank}")
        events = doc["traceEvents"]
        begins = [e for e in events if e.get("cat") == "p2p" and e["ph"] == "b"]
        assert {e["args"]["kind"] for e in begins} == {"ps"}
        meter = sum((Volume(**op) for op in doc["ringzero"]["meter"]["ops"].values()), Volume())
        assert sum(e["args"].get("bytes_sent", 0) for e in begins) == meter.bytes_sent > 0
        assert sum(e["args"].get("bytes_recv", 0) for e in begins) == meter.bytes_recv > 0
        assert sum(e["name"] == "push/pull" for e in events) == 3
    assert _load(tmp_path, "merged")["ringzero"]["clock"]["alignment_error_us"] < 1e5
