"""The parameter server's planner formulas (`plan.strategies.param_server`): key ranges, incast, α-β step time,
straggler waits, consistency bounds and their validation, checked by hand and with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringzero.plan.strategies import param_server as ps
from ringzero.plan.strategies.param_server import PSConfig

NUMEL = st.integers(min_value=0, max_value=10**12)
SERVERS = st.integers(min_value=1, max_value=512)
WORKERS = st.integers(min_value=1, max_value=512)
ITEMSIZE = st.sampled_from([1, 2, 4, 8])


def test_ranges_by_hand():
    assert ps.server_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert ps.server_ranges(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert ps.server_ranges(0, 2) == [(0, 0), (0, 0)]
    assert ps.server_ranges(7, 1) == [(0, 7)]


@given(NUMEL, SERVERS)
def test_ranges_tile_the_vector_and_differ_by_at_most_one(numel, servers):
    ranges = ps.server_ranges(numel, servers)
    assert len(ranges) == servers
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [hi - lo for lo, hi in ranges]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1


@given(NUMEL, SERVERS)
def test_imbalance_is_at_most_one_over_the_fair_share(numel, servers):
    eps = ps.imbalance(ps.server_ranges(numel, servers))
    assert eps >= 0.0
    if numel >= servers:
        assert eps <= 1 / (numel // servers) + 1e-12
    if numel % servers == 0:
        assert eps == 0.0


def test_imbalance_by_hand():
    assert ps.imbalance([(0, 4), (4, 7), (7, 10)]) == pytest.approx(4 / (10 / 3) - 1)   # 0.2
    assert ps.imbalance([(0, 0), (0, 0)]) == 0.0
    assert ps.imbalance([(0, 1), (1, 1)]) == pytest.approx(1.0)                         # 1 / mean 0.5


def test_bytes_by_hand():
    assert ps.worker_bytes(10, 2) == (20, 20)
    assert ps.server_ingress(10, 2, 4, 3) == [4 * 4 * 2, 4 * 3 * 2, 4 * 3 * 2]
    assert ps.server_egress(10, 2, 4, 3) == [32, 24, 24]


@given(NUMEL, ITEMSIZE, WORKERS, SERVERS)
def test_incast_adds_up_to_every_worker_pushing_everything(numel, itemsize, workers, servers):
    ingress = ps.server_ingress(numel, itemsize, workers, servers)
    assert sum(ingress) == workers * numel * itemsize == workers * ps.worker_bytes(numel, itemsize)[0]
    assert sum(ps.server_egress(numel, itemsize, workers, servers)) == sum(ingress)


def test_step_seconds_server_bound_by_hand():
    # 8 workers, 2 servers, 1000 fp16 elements: each server takes 8 * 500 * 2 = 8000 B each way.
    t = ps.step_seconds(1000, 2, 8, 2, compute_s=0.5, link_bw=1000.0, link_alpha=0.01)
    assert ps.server_link_seconds(1000, 2, 8, 2, 1000.0, 0.01) == pytest.approx(2 * 8 * 0.01 + 8.0)
    assert ps.worker_link_seconds(1000, 2, 2, 1000.0, 0.01) == pytest.approx(2 * 2 * 0.01 + 2.0)
    assert t == pytest.approx(0.5 + 0.16 + 8.0)


def test_step_seconds_worker_bound_by_hand():
    # 2 workers, 4 servers: a server moves 2 * 250 * 4 = 2000 B, a worker 4000 B.
    t = ps.step_seconds(1000, 4, 2, 4, compute_s=1.0, link_bw=1000.0)
    assert t == pytest.approx(1.0 + 4.0)
    assert ps.step_seconds(0, 4, 2, 4, compute_s=1.0, link_bw=1000.0, link_alpha=1.0) == 1.0


def test_staggered_pulls_then_the_last_push_by_hand():
    # 8 workers, 2 servers, 1000 fp16 elements: a server's 8 pulls of 1000 B go out one after
    # another (8 messages, 8000 B), then the last worker pushes its 2000 B to both servers.
    staggered = ps.comm_seconds(1000, 2, 8, 2, 1000.0, 0.01, schedule="staggered")
    assert staggered == pytest.approx((8 * 0.01 + 8.0) + (2 * 0.01 + 2.0))
    assert ps.comm_seconds(1000, 2, 8, 2, 1000.0, 0.01) == pytest.approx(2 * 8 * 0.01 + 8.0)
    # worker bound (2 workers, 4 servers): a worker's 4000 B pull, then its 4000 B push.
    assert ps.comm_seconds(1000, 4, 2, 4, 1000.0, schedule="staggered") == pytest.approx(8.0)
    assert ps.comm_seconds(0, 4, 2, 4, 1000.0, 1.0, schedule="staggered") == 0.0
    with pytest.raises(ValueError, match="allowed: overlapped, staggered"):
        ps.comm_seconds(10, 4, 2, 1, 1000.0, schedule="serial")


@given(NUMEL, ITEMSIZE, WORKERS, SERVERS)
def test_staggered_takes_between_the_overlapped_and_twice_it(numel, itemsize, workers, servers):
    over = ps.comm_seconds(numel, itemsize, workers, servers, 1e9)
    staggered = ps.comm_seconds(numel, itemsize, workers, servers, 1e9, schedule="staggered")
    assert over <= staggered * (1 + 1e-12) and staggered <= 2 * over * (1 + 1e-12)


def test_a_plan_as_a_parameter_server():
    from ringzero.plan.estimate import estimate
    from ringzero.plan.config import Parallel, Training
    from ringzero.plan.hardware import hardware
    from ringzero.plan.model.presets import model
    from ringzero.plan.strategies.ps_plan import ps_plan
    e = estimate(model("gpt2-xl"), Training(), Parallel(dp=8), hardware("a100-80gb"))
    p = ps_plan(e, 2)
    n, hw = e.params.total, e.hardware
    assert p.push_bytes == p.pull_bytes == 2 * n
    assert p.server_ingress_bytes == 8 * -(-n // 2) * 2                   # 8 workers x the larger range
    assert p.server_state_bytes == -(-n // 2) * (2 + 8 + 4)               # bf16 parameters, moments, master
    assert p.worker_memory_bytes == e.memory.total - e.memory.optimizer
    assert p.comm_s == max(p.server_link_s, p.worker_link_s) and p.bottleneck == "server link"
    assert p.step_s == pytest.approx(e.time.compute + ps.server_link_seconds(n, 2, 8, 2, hw.inter_bw, hw.inter_alpha))
    assert ps_plan(e, 16).bottleneck == "worker link"                    # more servers than workers
    with pytest.raises(ValueError, match="needs tp 1, pp 1, zero 0"):
        ps_plan(estimate(model("gpt2-xl"), Training(), Parallel(dp=8, zero=1), hardware("a100-80gb")), 2)
    with pytest.raises(ValueError, match="servers must be an integer >= 1"):
        ps_plan(e, 0)


def test_empty_ranges_send_no_messages():
    # 2 elements on 4 servers: a worker sends to 2 servers only.
    assert ps.worker_link_seconds(2, 1, 4, 1.0, link_alpha=10.0) == pytest.approx(2 * 2 * 10.0 + 2.0)


@given(st.integers(1, 10**9), ITEMSIZE, WORKERS, SERVERS)
def test_server_link_dominates_exactly_when_it_carries_more(numel, itemsize, workers, servers):
    server = ps.server_link_seconds(numel, itemsize, workers, servers, 1e9)
    worker = ps.worker_link_seconds(numel, itemsize, servers, 1e9)
    r_max = -(-numel // servers)
    assert (server >= worker) == (workers * r_max >= numel)
    if workers > servers:
        assert server > worker


def test_wait_seconds():
    assert ps.wait_seconds([1.0, 3.0, 2.5]) == [2.0, 0.0, 0.5]
    assert ps.wait_seconds([2.0]) == [0.0]
    assert ps.wait_seconds([]) == []


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=64))
def test_the_slowest_never_waits_and_nobody_waits_negative(compute):
    waits = ps.wait_seconds(compute)
    assert min(waits) == 0.0 and all(w >= 0 for w in waits)
    assert all(c + w == pytest.approx(max(compute)) for c, w in zip(compute, waits))


def test_config_bounds():
    assert PSConfig(4, 2).bound() == 0
    assert PSConfig(4, 2, "ssp", 3).bound() == 3
    assert PSConfig(4, 2, "ssp").bound() == 0
    assert PSConfig(4, 2, "async").bound() is None


def test_max_staleness():
    assert ps.max_staleness("sync", 0, 8) == 0
    assert ps.max_staleness("async", 0, 8) is None
    assert ps.max_staleness("ssp", 2, 4) == 2
    assert ps.max_staleness("ssp", 0, 4) == 0            # S = 0 is sync's gate
    assert ps.max_staleness("ssp", 7, 1) == 0            # one worker reads its own writes
    assert PSConfig(3, 1, "ssp", 1).max_staleness() == 1


@pytest.mark.parametrize("call, field", [
    (lambda: PSConfig(0, 1), "workers"),
    (lambda: PSConfig(2, 0), "servers"),
    (lambda: PSConfig(2, 1, "bsp"), "mode"),
    (lambda: PSConfig(2, 1, "ssp", -1), "staleness"),
    (lambda: PSConfig(2, 1, "sync", 2), "staleness"),
    (lambda: PSConfig(2, 1, "async", 1), "staleness"),
    (lambda: PSConfig(2.0, 1), "workers"),
    (lambda: ps.server_ranges(10, 0), "servers"),
    (lambda: ps.server_ranges(-1, 2), "numel"),
    (lambda: ps.worker_bytes(10, 0), "itemsize"),
    (lambda: ps.server_ingress(10, 2, 0, 1), "workers"),
    (lambda: ps.step_seconds(10, 2, 2, 1, compute_s=-1.0, link_bw=1.0), "compute_s"),
    (lambda: ps.step_seconds(10, 2, 2, 1, compute_s=1.0, link_bw=0.0), "link_bw"),
    (lambda: ps.step_seconds(10, 2, 2, 1, compute_s=1.0, link_bw=1.0, link_alpha=-1e-6), "link_alpha"),
    (lambda: ps.wait_seconds([1.0, -2.0]), "compute_s[1]"),
    (lambda: ps.max_staleness("ssp", 1, 0), "workers"),
    (lambda: ps.imbalance([]), "range"),
])
def test_errors_are_one_line_and_name_the_field(call, field):
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and field in msg


def test_mode_error_lists_what_is_allowed():
    with pytest.raises(ValueError, match="allowed: sync, async, ssp"):
        PSConfig(2, 1, "bsp")


def _worst_ssp_staleness(workers: int, s: int, steps: int) -> int:
    """Largest staleness over every interleaving of SSP pulls and pushes (the gate and the clocks of
    `max_staleness`'s docstring: the server's clock is the slowest worker's), each worker running
    `steps` steps."""
    worst, seen = 0, set()
    stack = [((0,) * workers, (None,) * workers)]       # clocks, version each worker pulled (None: idle)
    while stack:
        clocks, reads = stack.pop()
        if (clocks, reads) in seen:
            continue
        seen.add((clocks, reads))
        for i, read in enumerate(reads):
            if read is None and clocks[i] < steps and min(clocks) >= clocks[i] - s:
                stack.append((clocks, reads[:i] + (min(clocks),) + reads[i + 1:]))
            elif read is not None:
                worst = max(worst, clocks[i] - read)         # its step minus the clock it read
                pushed = clocks[:i] + (clocks[i] + 1,) + clocks[i + 1:]
                stack.append((pushed, reads[:i] + (None,) + reads[i + 1:]))
    return worst


@pytest.mark.parametrize("workers, s", [(1, 2), (2, 0), (2, 2), (3, 0), (3, 1)])
def test_ssp_bound_is_exact_over_every_interleaving(workers, s):
    assert _worst_ssp_staleness(workers, s, 2 * s + 3) == ps.max_staleness("ssp", s, workers)


def test_server_state_bytes_by_hand():
    # fp32: the range is the master; Adam's m and v beside it. bf16: a separate fp32 master too.
    assert ps.server_state_bytes(10, 4, 3) == [4 * 12, 3 * 12, 3 * 12]
    assert ps.server_state_bytes(10, 2, 2) == [5 * 14, 5 * 14]
