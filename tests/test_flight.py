"""The flight recorder: every collective's start and end on each rank, and the wait for peers
measured from arrival times (a rank that arrives first waits until the last one arrives)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from ringzero import comm
from ringzero.comm import flight
from ringzero.comm.timeline import CallRecord, Timeline, waits


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
    assert [k["seq"] for k in kept0] == [c.seq for c in calls0]     # the recorder keeps the latest
