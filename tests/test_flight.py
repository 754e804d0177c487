"""The flight recorder: every collective's start and end on each rank, kept as torch's flight
recorder entries in a ring sized as torch's (TORCH_NCCL_TRACE_BUFFER_SIZE), and the wait for peers
measured from arrival times (a rank that arrives first waits until the last one arrives)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from ringzero import comm
from ringzero.comm import flight, flight_watch
from ringzero.comm.timeline import CallRecord, Timeline, waits
from ringzero.errors import UsageError

TORCH_FIELDS = {"record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
                "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms",
                "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state", "is_p2p", "retired",
                "timeout_ms", "thread_name"}
"""The fields of an entry of torch's flight recorder (torch/csrc/distributed/c10d/FlightRecorder.hpp)."""


def _rec(start, end, seq=0, ranks=(0, 1), beside=False):
    return CallRecord("all_reduce", ranks, seq, start=start, end=end, beside=beside)


def _log(calls, blocked=()):
    t = Timeline()
    t.calls, t.blocked = list(calls), list(blocked)
    return t


@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=6))
def test_wait_is_the_arrival_gap_capped_by_the_call(spans):
    ranks = tuple(range(len(spans)))
    calls = [_log([_rec(s, s + d, ranks=ranks)]) for s, d in spans]
    last = max(s for s, _ in spans)
    assert waits(calls) == pytest.approx([min(last - s, (s + d) - s) for s, d in spans])


def test_calls_are_matched_by_group_and_sequence_and_incomplete_ones_are_left_out():
    a = [_rec(0.0, 1.0, seq=0), _rec(2.0, 3.0, seq=1), _rec(4.0, None, seq=2), _rec(5.0, 6.0, ranks=(0, 2))]
    b = [_rec(0.5, 1.0, seq=0), _rec(2.9, 3.0, seq=1), _rec(4.5, 5.0, seq=2)]
    # seq 2: rank 0's call never ended (0); the (0, 2) call: rank 2 is not here (left out).
    assert waits([_log(a), _log(b)]) == [pytest.approx(0.5 + 0.9), 0.0]


def test_a_wait_beside_computation_counts_only_while_the_computing_thread_is_blocked():
    # Rank 0's communication thread enters at 0 and rank 1 at 3; rank 0's computing thread runs
    # until 2, then blocks for the communication thread: it loses 1 s, not 3.
    a = _log([_rec(0.0, 3.5, beside=True)], blocked=[(2.0, 3.5)])
    b = _log([_rec(3.0, 3.5, beside=True)], blocked=[(3.2, 3.5)])
    assert waits([a, b]) == [pytest.approx(1.0), 0.0]
    assert waits([_log(a.calls), b]) == [0.0, 0.0]          # never blocked: lost nothing


def _late_rank(group, delay):
    t = torch.ones(1 << 18)
    with Timeline() as tl:
        comm.all_reduce(t, group=group, algorithm="ring")
        if dist.get_rank(group) == 1:
            time.sleep(delay)
        comm.all_reduce(t, group=group, algorithm="ring")
        with pytest.raises(ValueError):
            comm.all_reduce(t, op="max_of_nothing", group=group, algorithm="ring")
    return tl.calls, flight.dump()[-3:]


@pytest.mark.timeout(120)
def test_a_late_rank_is_waited_for_and_every_call_is_recorded(pool):
    delay = 0.3
    (calls0, kept0), (calls1, kept1) = pool.run(_late_rank, delay, world=2)
    w = waits([_log(calls0[1:]), _log(calls1[1:])])      # the first call lines up ranks the pool started apart
    assert w[0] == pytest.approx(delay, abs=0.1) and w[1] < 0.05, w
    assert [c.state for c in calls0] == ["completed", "completed", "failed"]
    assert [c.algorithm for c in calls0[:2]] == ["ring", "ring"] and calls0[0].bytes == (1 << 18) * 4
    assert calls0[1].seq == calls0[0].seq + 1 and calls0[0].ranks == (0, 1)
    assert [k["collective_seq_id"] for k in kept0] == [c.seq for c in calls0]     # the recorder keeps the latest
    assert all(TORCH_FIELDS | {"ranks", "algorithm", "bytes", "kind"} <= k.keys() for k in kept0)
    assert [k["state"] for k in kept0] == ["completed", "completed", "failed"]
    assert [k["record_id"] for k in kept0] == [kept0[0]["record_id"] + i for i in range(3)]
    first = kept0[0]
    assert first["profiling_name"] == "ringzero:all_reduce" and first["process_group"][1] in ("default_pg", "undefined")
    assert first["input_sizes"] == first["output_sizes"] == [[1 << 18]] and first["input_dtypes"] == ["Float"]
    assert first["time_discovered_completed_ns"] >= first["time_created_ns"] and first["duration_ms"] >= 0
    assert first["retired"] and not first["is_p2p"] and first["ranks"] == [0, 1]


def test_the_buffer_is_sized_as_torch_sizes_its_own():
    assert flight.buffer_size({}) == 2000
    assert flight.buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "16"}) == 16
    assert flight.buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "16", "TORCH_FR_BUFFER_SIZE": "8"}) == 8
    assert flight.buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) == 0          # keeps none, as torch
    for bad in ("-1", "lots", "1.5"):
        with pytest.raises(UsageError, match="TORCH_NCCL_TRACE_BUFFER_SIZE=.*whole number") as err:
            flight.buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": bad})
        assert "\n" not in str(err.value)


def test_the_buffer_size_is_read_when_the_recorder_loads():
    code = "from ringzero.comm import flight; print(flight.KEEP, flight.RECORDER.maxlen)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "TORCH_NCCL_TRACE_BUFFER_SIZE": "3"}).stdout
    assert out.split() == ["3", "3"]


def _stuck(group, token):
    """Rank 0 waits in an all-reduce that rank 1 makes only once rank 0 has read its own entry
    (told through the job's store: the group is busy)."""
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(8)
    for _ in range(3):
        comm.all_reduce(t, group=group)
    if dist.get_rank(group) == 1:
        store.wait([token])
        comm.all_reduce(t, group=group)
        return None
    late = threading.Thread(target=comm.all_reduce, args=(t,), kwargs={"group": group})
    late.start()
    while not flight.dump(last=0):
        time.sleep(0.01)
    fresh = flight_watch.state()                                  # in flight for a moment only
    stuck = flight_watch.state(time.time() + flight_watch.DUMP_AFTER + 1)
    store.set(token, "read")
    late.join()
    return fresh, stuck, len(flight.dump())


@pytest.mark.timeout(120)
def test_a_rank_publishes_its_calls_in_flight_and_once_stuck_its_last_ones(pool):
    fresh, stuck, kept = pool.run(_stuck, f"test-flight/{uuid.uuid4().hex}", world=2)[0]
    assert set(fresh) == {"version", "pg_config", "pg_status", "entries"}           # torch's dump layout
    (call,) = fresh["entries"]
    assert call["state"] == "started" and call["time_discovered_completed_ns"] is None
    status = fresh["pg_status"][str(call["pg_id"])]
    assert status["last_started_collective"] == call["collective_seq_id"] == status["last_completed_collective"] + 1
    assert fresh["pg_config"][call["process_group"][0]]["ranks"] == str(call["ranks"])
    assert len(stuck["entries"]) == min(kept, flight_watch.RECENT) and stuck["entries"][-1] == call
