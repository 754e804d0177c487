"""The simulator's network model against hand-solved cases and the planner's closed form: max-min
fair rates, a step played as flows finish, α-β equality where no link is shared, link loads equal
to the planner's cross-node bytes, and the compressed play equal to the message-by-message one."""

from __future__ import annotations

import numpy as np
import pytest

from ringzero.plan.comm.links import cross_node_bytes
from ringzero.plan.comm.schedule import asap
from ringzero.plan.comm.schedule.build import schedule_for
from ringzero.plan.comm.schedule.step import Schedule, Step
from ringzero.plan.comm.volume import call_for
from ringzero.plan.hardware import HARDWARE
from ringzero.plan.step_time import op_seconds
from ringzero.plan.strategies.traffic import CommOp
from ringzero.simulate.collective import EXACT_ROLLS, play_schedule, simulate
from ringzero.simulate.fairshare import rates
from ringzero.simulate.fluid import play
from ringzero.simulate.topology import PRESETS, preset

GB = 1e9


def test_two_flows_on_one_link_get_half_its_bandwidth_each():
    links, cap = np.array([[0], [0]]), np.array([10 * GB])
    assert rates(links, cap) == pytest.approx([5 * GB, 5 * GB], rel=1e-12)
    got = play(links, np.zeros(2), np.array([1e9, 1e9]), cap)
    assert got.seconds == pytest.approx(0.2, rel=1e-12) and got.events == 1


def test_three_flows_over_two_links_take_the_max_min_allocation():
    """Link 0 (10 GB/s) carries flows a, b; link 1 (4 GB/s) carries b, c. By hand: link 1's fair
    share, 2, is the lower, so b and c freeze at 2; a takes what link 0 has left, 10 - 2 = 8."""
    links, cap = np.array([[0, -1], [0, 1], [1, -1]]), np.array([10 * GB, 4 * GB])
    assert np.allclose(rates(links, cap), [8 * GB, 2 * GB, 2 * GB], rtol=1e-9, atol=0)
    # Played: 8 GB for a, 4 GB for b and c. All three move at (8, 2, 2) until b and c finish at
    # 2 s (a has moved 16 > 8 GB by then: a finishes first, at 1 s). At 1 s a leaves with 8 GB done;
    # b and c keep 2 GB/s each (link 1 still binds them), so they end at 2 s.
    got = play(links, np.array([1e-6, 1e-6, 2e-6]), np.array([8e9, 4e9, 4e9]), cap)
    assert np.allclose(got.finish, [1 + 1e-6, 2 + 1e-6, 2 + 2e-6], rtol=1e-9, atol=0) and got.events == 2


def test_a_freed_link_is_re_shared():
    """a and b share link 0 (4 GB/s); a has 1 GB, b 3 GB: both at 2 until a ends at 0.5 s, then b
    alone at 4 moves its remaining 2 GB in 0.5 s."""
    got = play(np.array([[0], [0]]), np.zeros(2), np.array([1e9, 3e9]), np.array([4 * GB]))
    assert np.allclose(got.finish, [0.5, 1.0], rtol=1e-9, atol=0)


def test_the_presets_share_the_planners_figures():
    for name, gpu in (("dgx-a100", "a100-80gb"), ("dgx-h100", "h100-sxm"), ("dgx-h200", "h200")):
        p, hw = PRESETS[name], HARDWARE[gpu]
        assert (p["nvlink_bw"], p["nic_bw"], p["gpus_per_node"]) == (hw.intra_bw, hw.inter_bw, hw.gpus_per_node)
        assert (p["nvlink_latency"], p["nic_latency"]) == (hw.intra_alpha, hw.inter_alpha)
    assert PRESETS["dgx-a100"]["nic_bw"] == 200e9 / 8 and PRESETS["dgx-h100"]["nic_bw"] == 400e9 / 8


@pytest.mark.parametrize("algorithm,gpus", [("ring", 8), ("butterfly", 8), ("rabenseifner", 8), ("ring", 16),
                                            ("ring", 64), ("ring", 2), ("rabenseifner", 4)])
def test_with_no_shared_link_the_simulation_is_the_planners_alpha_beta(algorithm, gpus):
    """One node's NVSwitch, or a ring whose every step crosses nodes once per NIC on a non-blocking
    fat tree: no two flows of a step share a link, so each step is α + chunk/bandwidth."""
    topo, hw, nbytes = preset("dgx-h100", gpus), HARDWARE["h100-sxm"], 1 << 30
    node = min(gpus, 8)
    planned = op_seconds(CommOp("dp", "", "all_reduce", algorithm, gpus, nbytes // 4, 4, 1, node, "none"), hw)
    played = simulate("all_reduce", algorithm, topo, nbytes)
    assert played.seconds == pytest.approx(planned, rel=0.01) and played.exact


@pytest.mark.parametrize("gpus", [2, 5, 8])
def test_a_tree_takes_its_textbook_time_not_the_planners(gpus):
    """A binomial reduce then broadcast is 2⌈log2 n⌉ dependent rounds of the whole buffer
    (Thakur, Rabenseifner & Gropp 2005 §4): 2⌈log2 n⌉(α + S/B). The planner prices a rank's bytes
    as max(sent, received), full duplex, which a tree's receive-then-send rounds never reach, so
    its figure is half the bandwidth term: the simulator is the one that follows the schedule."""
    topo, hw, nbytes = preset("dgx-h100", gpus), HARDWARE["h100-sxm"], 1 << 30
    rounds = 2 * (gpus - 1).bit_length()
    played = simulate("all_reduce", "tree", topo, nbytes).seconds
    assert played == pytest.approx(rounds * (hw.intra_alpha + nbytes / hw.intra_bw), rel=1e-9)
    planned = op_seconds(CommOp("dp", "", "all_reduce", "tree", gpus, nbytes // 4, 4, 1, gpus, "none"), hw)
    assert planned < 0.6 * played


def test_the_nics_carry_the_planners_cross_node_bytes():
    topo = preset("dgx-a100", 32)
    for algorithm in ("ring", "tree", "hierarchical", "hierarchical_2d", "rabenseifner"):
        call = call_for("all_reduce", algorithm, 32, 3 * 2**20 + 7, 4, 0, 8)
        played = play_schedule(schedule_for("all_reduce", algorithm, 32, call.count, 4, 0, 8), topo)
        nic_tx = played.link_bytes[2 * 32: 2 * 32 + topo.nodes * topo.nics_per_node].sum()
        planned = sum(cross_node_bytes(call, r, range(32), 8)[0] for r in range(32))
        assert nic_tx == planned, algorithm


def test_shared_nics_and_an_oversubscribed_spine_slow_a_ring():
    base = simulate("all_reduce", "ring", preset("dgx-h100", 64), 1 << 30).seconds
    shared = simulate("all_reduce", "ring", preset("dgx-h100", 64, nics_per_node=1), 1 << 30)
    assert shared.seconds == pytest.approx(base, rel=1e-12)  # one crossing per node: one NIC is enough
    flat = simulate("all_reduce", "hierarchical_2d", preset("dgx-h100", 64), 1 << 30).seconds
    one_nic = simulate("all_reduce", "hierarchical_2d", preset("dgx-h100", 64, nics_per_node=1), 1 << 30)
    assert one_nic.seconds > 4 * flat                     # 8 rings cross through one NIC: ~8x its bytes
    assert one_nic.busiest(preset("dgx-h100", 64, nics_per_node=1))[0].startswith("nic")
    # A flat ring leaves each node from GPU 7 (rail 7) for GPU 0 (rail 0): every crossing climbs to
    # the spine, 4 per leaf; at 4:1 the leaf's uplink is one NIC's worth: each gets a quarter.
    # hierarchical_2d's rings stay on their rail and only cross the spine at a leaf's edge.
    spine, full = (preset("dgx-h100", 512, nodes_per_leaf=4, oversubscription=x) for x in (4, 1))
    chunk = (1 << 30) / 512
    ring_slow, ring_full = (simulate("all_reduce", "ring", t, 1 << 30) for t in (spine, full))
    # each of the 2·511 steps: chunk / (50 GB/s / 4) instead of chunk / 50 GB/s
    assert ring_slow.seconds - ring_full.seconds == pytest.approx(2 * 511 * 3 * chunk / 50e9, rel=1e-9)
    assert ring_slow.busiest(spine)[0].startswith("leaf")
    assert simulate("all_reduce", "hierarchical_2d", spine, 1 << 30).seconds == \
        pytest.approx(simulate("all_reduce", "hierarchical_2d", full, 1 << 30).seconds, rel=1e-12)


def _listed_play(sched, topo) -> float:
    """Play every step of the listed schedule one by one, no step priced for another."""
    steps = []
    for s in sched.steps:
        for i in range(s.repeat):
            sizes, pieces = s.sizes_at(i)
            steps.append(Step(s.src, s.dst, sizes, pieces, tag=s.tag))
    return play_schedule(Schedule(sched.call, tuple(steps)), topo).seconds


@pytest.mark.timeout(240)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical", "hierarchical_2d"])
def test_the_compressed_play_equals_the_message_by_message_play(algorithm):
    for n in (8, 16, 24, 64, 256):
        topo = preset("dgx-a100", n, nics_per_node=2)       # shared NICs: flows contend
        for count in (n * 1000, n * 1000 + 3, n // 2):
            call = call_for("all_reduce", algorithm, n, count, 4, 0, 8)
            built = play_schedule(schedule_for("all_reduce", algorithm, n, count, 4, 0, 8), topo)
            listed = _listed_play(asap.schedule(call), topo)
            exact = built.exact or n - 1 <= EXACT_ROLLS
            assert built.seconds == pytest.approx(listed, rel=1e-12 if exact else 1e-3), (n, count)
            assert built.exact == (exact or algorithm == "tree")


def test_a_straggler_stretches_its_sends():
    """GPU 7 sends the ring's node crossing: at half speed every step waits for it. GPU 3 sends
    inside the node at 450 GB/s: at half speed it still beats the 50 GB/s crossing."""
    topo = preset("dgx-h100", 16)
    sched = schedule_for("all_reduce", "ring", 16, 1 << 26)
    base = play_schedule(sched, topo).seconds
    assert play_schedule(sched, topo, slow={3: 2.0}).seconds == pytest.approx(base, rel=1e-12)
    assert 1.9 * base < play_schedule(sched, topo, slow={7: 2.0}).seconds <= 2.0 * base
