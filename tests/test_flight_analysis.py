"""Reading a hung job's flight recorder dumps as torch's fr_trace analyzer reads NCCL's: the
collective that broke, its sequence number, its group and the ranks at fault, in torch's words,
for a frozen rank, a rank that called another collective and a rank that skipped one."""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
import uuid

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import flight, flight_analysis, flight_watch


def _e(seq, op="all_reduce", state="completed", ranks=(0, 1, 2), n=16, group="0", desc="default_pg", out=None,
       made=None):
    made = 1000 * seq if made is None else made
    return {"record_id": seq, "pg_id": int(group), "process_group": [group, desc], "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"ringzero:{op}", "time_created_ns": made,
            "time_discovered_started_ns": made, "time_discovered_completed_ns": None,
            "input_sizes": [[n]], "input_dtypes": ["Float"], "output_sizes": [[n if out is None else out]],
            "output_dtypes": ["Float"], "state": state, "is_p2p": False, "retired": state != "started",
            "ranks": list(ranks)}


def _history(upto, **kw):
    """Calls 0..upto-1 completed, call `upto` in flight."""
    return [_e(s, **kw) for s in range(upto)] + [_e(upto, state="started", **kw)]


def test_a_frozen_rank_is_a_missing_rank():
    # Rank 1 froze before call 3; stuck ranks publish their history, a rank in no collective none.
    line = flight_analysis.verdict({0: _history(3), 1: [], 2: _history(3)})
    assert line.startswith("Not all ranks joining collective, sequence number: 3; group info: 0:default_pg; "
                           "collective: ringzero:all_reduce; missing ranks: {1}; collective state: started"), line
    assert "rank 1 is in no collective" in line


def test_a_rank_that_went_on_without_a_collective_is_missing_there_and_named_where_it_waits():
    # Rank 1 skipped call 3 on group 0 and waits in group 1's first call for rank 2, which waits in
    # call 3 for rank 1: of the two calls missing a rank, the older one is named.
    went_on = [_e(s) for s in range(3)] + [_e(0, state="started", ranks=(1, 2), group="1", desc="undefined", made=3500)]
    line = flight_analysis.verdict({0: _history(3), 1: went_on, 2: _history(3)})
    assert "sequence number: 3; group info: 0:default_pg" in line and "missing ranks: {1}" in line, line
    assert "rank 1 is in all_reduce #0 on group 1 (it went on without this one)" in line


def test_a_rank_that_called_another_collective_is_the_culprit_of_a_type_mismatch():
    other = _history(3)[:-1] + [_e(3, op="broadcast", state="started")]
    line = flight_analysis.verdict({0: _history(3), 1: other, 2: _history(3)})
    assert line.startswith("Collective sequence number: 3 has errors; group info: 0:default_pg; collective: "
                           "ringzero:all_reduce; error msg: Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH, "
                           "Expected collective type: 'all_reduce' does not match found collective type: "
                           "'broadcast'"), line


def test_a_rank_that_skipped_a_collective_stands_one_call_ahead():
    # Steps of (all_reduce, all_gather); rank 2 skips the all_gather of step 1 (call 3): its call 3
    # is the next step's all-reduce.
    step = [("all_reduce", 16), ("all_gather", 4)]
    peers = [_e(s, op=step[s % 2][0], n=step[s % 2][1]) for s in range(3)] + [_e(3, op="all_gather", n=4, state="started")]
    skipper = peers[:3] + [_e(3, op="all_reduce", n=16, state="started")]
    line = flight_analysis.verdict({0: peers, 1: peers, 2: skipper})
    assert "Collective sequence number: 3 has errors" in line and "collective: ringzero:all_gather" in line, line
    assert "Culprit rank 2; Error type: COLLECTIVE_TYPE_MISMATCH" in line and "skipped all_gather #3" in line


def test_other_sizes_are_a_size_mismatch_but_a_rooted_calls_own_buffers_are_not():
    line = flight_analysis.verdict({0: _history(2), 1: _history(2)[:-1] + [_e(2, n=8, state="started")],
                                    2: _history(2)})
    assert "Culprit rank 1; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: '[[16]]' does not match " \
           "found input sizes: '[[8]]'" in line, line
    gathers = {r: [_e(0, op="gather", out=48 if r == 0 else 0)] for r in range(3)}  # only the root gets the list
    assert flight_analysis.verdict(gathers) == flight_analysis.NO_ERRORS


def test_a_rank_without_a_dump_cannot_be_judged():
    line = flight_analysis.verdict({0: _history(3), 1: _history(3)})
    assert line.startswith("We cannot decide what's wrong with this collective entry because we missed FR dumps "
                           "from ranks ({2})"), line


def test_load_reads_the_stall_reports_file_and_names_a_file_that_is_not_one(tmp_path):
    good = tmp_path / "flight.json"
    good.write_text(json.dumps({"1": {"version": flight.VERSION, "pg_config": {}, "pg_status": {}, "entries": []},
                                "0": {"version": flight.VERSION, "pg_config": {}, "pg_status": {},
                                      "entries": _history(1)}}))
    assert flight_analysis.load(str(good)) == {0: _history(1), 1: []}
    for text in ("not json", "[1, 2]", '{"zero": []}', '{"0": {"entries": [{"seq": 1}]}}'):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=f"^{bad}: not a flight recorder dump") as err:
            flight_analysis.load(str(bad))
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="missing.json: cannot read it"):
        flight_analysis.load(str(tmp_path / "missing.json"))


def _torch_says(dumps: dict[int, list[dict]], caplog) -> list[str]:
    """What torch's own fr_trace analyzer logs for `dumps` (its backends list has no "ringzero")."""
    from torch.distributed.flight_recorder.components.builder import build_db
    details = {}
    for r, entries in dumps.items():
        relabelled = [{**e, "profiling_name": e["profiling_name"].replace("ringzero:", "gloo:")} for e in entries]
        details[f"rank{r}"] = {"rank": r, "entries": relabelled, "version": flight.VERSION,
                               "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}}
    args = argparse.Namespace(verbose=False, just_print_entries=False, allow_incomplete_ranks=False, mismatch_cap=10)
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        build_db(details, args, flight.VERSION)
    return [r.getMessage() for r in caplog.records if r.name == "Flight Recorder"]


def test_the_words_are_those_of_torchs_analyzer(caplog):
    """Given full histories (torch's analyzer needs them), torch's fr_trace says what verdict says."""
    frozen = {0: _history(3), 1: [_e(s) for s in range(3)], 2: _history(3)}
    other = {0: _history(3), 1: _history(3)[:-1] + [_e(3, op="broadcast", state="started")], 2: _history(3)}
    for dumps in (frozen, other):
        caplog.clear()
        said = _torch_says(dumps, caplog)
        ours = flight_analysis.verdict(dumps).replace("ringzero:", "gloo:")
        first = said.index(next(m for m in said if "sequence number" in m))
        wanted = [m for m in said[first:first + 12] if m.split(":")[0] in (
            "group info", "collective", "missing ranks", "error msg", "Not all ranks joining collective, sequence number",
            "Collective sequence number")]
        assert len(wanted) >= 3 and all(m in ours for m in wanted), (said, ours)


def _skip_one(group, token):
    """Rank 1 skips an all-reduce its peer waits in; the stall report is read while it hangs, then
    rank 1 makes the call after all, so that the pool goes on."""
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(4)
    comm.all_reduce(t, group=group)
    if dist.get_rank(group) == 1:
        while not store.check([token]):    # (store.wait would hold the GIL: no flight thread would run)
            time.sleep(0.05)
        comm.all_reduce(t, group=group)
        return None
    waiting = threading.Thread(target=comm.all_reduce, args=(t,), kwargs={"group": group})
    waiting.start()
    while not flight.dump(last=0):
        time.sleep(0.01)
    seq = flight.dump(last=0)[0]["collective_seq_id"]
    line = ""
    for _ in range(40):                # until both flight threads (every PERIOD s) have published since
        time.sleep(flight_watch.PERIOD)
        if line:
            os.remove(line.rsplit(": ", 1)[1])
        line = flight_watch.diagnose(store.underlying_store, dist.get_process_group_ranks(group))
        if f"its last there: #{seq - 1}" in line:
            break
    store.set(token, "diagnosed")
    waiting.join()
    return line, seq


@pytest.mark.timeout(120)
def test_a_real_skipped_collective_is_named_by_the_stall_report_and_the_verdict(pool):
    # The ranks publish to the launcher's store (the group's default store is a prefix of it).
    line, seq = pool.run(_skip_one, f"test-flight-analysis/{uuid.uuid4().hex}", world=2)[0]
    assert f"all_reduce #{seq} (" in line and f"rank 1 (its last there: #{seq - 1}) never arrived" in line, line
    path = line.rsplit(": ", 1)[1]
    try:
        verdict = flight_analysis.verdict(flight_analysis.load(path))
    finally:
        os.remove(path)
    assert f"Not all ranks joining collective, sequence number: {seq};" in verdict, verdict
    assert "collective: ringzero:all_reduce; missing ranks: {1}; collective state: started" in verdict, verdict


def test_analyze_prints_the_verdict_of_a_hangs_dump(tmp_path, capsys):
    from ringzero import cli
    dump = {str(r): {"version": flight.VERSION, "pg_config": {}, "pg_status": {}, "entries": h}
            for r, h in {0: _history(5), 1: [], 2: _history(5)}.items()}
    path = tmp_path / "stall.json"
    path.write_text(json.dumps(dump))
    assert cli.main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("Not all ranks joining collective, sequence number: 5;") and "missing ranks: {1}" in out, out
