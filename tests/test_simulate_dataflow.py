"""The rank-by-rank play (`simulate.dataflow`): exact on cases solved by hand, bounded by the host
price below and by host + the synchronous play above."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.plan.comm.schedule.build import schedule_for
from ringzero.simulate import local
from ringzero.simulate.dataflow import dataflow_seconds

ALGORITHMS = ("ring", "tree", "hierarchical", "hierarchical_2d", "rabenseifner", "butterfly", "naive")
GB = 1e9


def _runs(algorithm: str, n: int, rpn: int) -> bool:
    try:
        schedule_for("all_reduce", algorithm, n, 1000, 4, 0, rpn)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("algorithm,n,rpn", [(a, n, r) for a in ALGORITHMS for n, r in ((2, 1), (4, 2), (6, 2), (8, 4))
                                              if _runs(a, n, r)])
def test_with_free_links_the_play_takes_exactly_the_host_price(algorithm, n, rpn):
    sched = schedule_for("all_reduce", algorithm, n, 3 << 18, 4, 0, rpn)
    assert dataflow_seconds(sched, rpn, float("inf"), 0.0, 0.0123) == pytest.approx(0.0123, rel=1e-12)


def test_a_ring_in_nodes_of_two_overlaps_one_ranks_link_with_anothers_host_work():
    # 4 ranks, nodes {0, 1} and {2, 3}: edges 1->2 and 3->0 cross, each step one 256 KiB chunk of
    # L = 262,144 ns at 1 GB/s, host 6L in all (L per step on the rank that receives). By hand:
    # steps 1-2 end at 3L on every rank, and each two steps after add 3L (the crossing ranks wait
    # L for their NIC, the others L for their data), so 6 steps end at 9L: the sum would be 12L.
    sched = schedule_for("all_reduce", "ring", 4, 1 << 18, 4, 0, 2)
    L = (1 << 18) / GB
    assert dataflow_seconds(sched, 2, GB, 0.0, 6 * L) == pytest.approx(9 * L, rel=1e-12)
    # without host work the NICs bind: each of ranks 1 and 3 sends its 6 chunks one after another
    assert dataflow_seconds(sched, 2, GB, 0.0, 0.0) == pytest.approx(6 * L, rel=1e-12)


def test_segments_pipeline_across_steps():
    # 2 ranks on 2 nodes, 4 MiB: each step's 2 MiB chunk goes as two 1 MiB segments of tau; the
    # all-gather's first segment leaves as soon as the NIC is free (the reduce-scatter's second is
    # still on the wire when its first is in), so 4 segments back to back and one latency: 4 tau + a.
    sched = schedule_for("all_reduce", "ring", 2, 1 << 20, 4, 0, 1)
    assert [s.pieces for s in sched.steps] == [(2, 2), (2, 2)]
    tau, a = (1 << 20) / GB, 1e-5
    assert dataflow_seconds(sched, 1, GB, a, 0.0) == pytest.approx(4 * tau + a, rel=1e-12)
    assert local.link_seconds("all_reduce", "ring", 2, 1 << 20, 4, 1, 1.0, 10.0) > 4 * tau + a


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(ALGORITHMS), nodes=st.integers(1, 4), rpn=st.sampled_from([1, 2, 4]),
       count=st.sampled_from([1000, 1 << 16, 1 << 18, 3 << 19]), gbps=st.sampled_from([0.1, 1.0, 10.0]),
       latency_us=st.sampled_from([0.0, 20.0, 200.0]), host=st.sampled_from([0.0, 1e-4, 1e-3, 1e-2]))
def test_the_play_lies_between_the_host_price_and_host_plus_links(algorithm, nodes, rpn, count, gbps,
                                                                  latency_us, host):
    n = nodes * rpn
    if n < 2:
        return
    try:
        link = local.link_seconds("all_reduce", algorithm, n, count, 4, rpn, gbps, latency_us)
    except ValueError:
        return
    got = local.seconds("all_reduce", algorithm, n, count, 4, rpn, gbps, latency_us, host)
    assert host * (1 - 1e-12) <= got <= (host + link) * (1 + 1e-9)
