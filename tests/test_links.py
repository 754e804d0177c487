"""Emulated nodes: the meter's cross-node bytes equal `plan.comm.links`, and the link emulator delays.

Nodes are `ranks_per_node` consecutive global ranks. For every algorithm `plan.comm.links` models, on
prefix groups and on sub-groups whose global ranks are not 0..n-1, every rank's
cross_node_bytes_sent/recv measured by `TrafficMeter` equal `plan.comm.links.cross_node_bytes`, and the
bytes the emulator held back are exactly the cross-node bytes sent. The emulator's delay is checked
as a lower bound only (a sleep never ends early), together with the CPU it costs (none: it sleeps).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import link_emulator, point_to_point
from ringzero.comm.config import CommConfig
from ringzero.plan.comm import links
from ringzero.plan.comm.algorithms import ALGORITHMS, NODE_AWARE, fits
from ringzero.plan.comm.volume import ROOTED, call_for, volume

from collective_cases import run_once

COUNTS = (5, 1001)
CASES = [(c, a) for c in ALGORITHMS for a in links.modelled(c)]


def _compare(g, members, rpn):
    """Every modelled (collective, algorithm) on group `g` (global ranks `members`): mismatches."""
    n, r = dist.get_world_size(g), dist.get_rank(g)
    bad = []
    with comm.configure(ranks_per_node=rpn):
        for coll, algo in [(c, a) for c, a in CASES if fits(a, n, comm.get_config().node_size(n))]:
            for root in (sorted({0, n - 1}) if coll in ROOTED else [0]):
                for count in COUNTS:
                    with comm.TrafficMeter() as m:
                        run_once(coll, algo, g, n, r, count, root)
                    t = m.get(coll, algo)
                    whole = count if coll in ("all_reduce", "reduce", "broadcast", "all_to_all") else n * count
                    call = call_for(coll, algo, n, whole, 4, root=root,
                                    ranks_per_node=comm.get_config().node_size(n))
                    planned = links.cross_node_bytes(call, r, members, rpn)
                    if (t.cross_node_bytes_sent, t.cross_node_bytes_recv) != planned:
                        bad.append(f"{coll}/{algo} members={members} rpn={rpn} rank={r} count={count} "
                                   f"root={root}: meter {(t.cross_node_bytes_sent, t.cross_node_bytes_recv)} "
                                   f"!= plan {planned}")
    return bad


def _prefix(g, rpn):
    return _compare(g, list(range(dist.get_world_size(g))), rpn)


def _subgroup(_world, members, rpn):
    g = dist.new_group(members)  # every rank of the world takes part in new_group
    try:
        return _compare(g, members, rpn) if dist.get_rank() in members else []
    finally:
        dist.destroy_process_group(g)


def _flatten(results):
    return [b for rank_bad in results for b in rank_bad]


@pytest.mark.parametrize("world,rpn", [(4, 2), (8, 4), (8, 2), (4, None)])
def test_meter_cross_node_bytes_equal_plan(pool, world, rpn):
    bad = _flatten(pool.run(_prefix, rpn, world=world, timeout=60))
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"


@pytest.mark.parametrize("members,rpn", [([1, 3, 5, 7], 2), ([4, 5, 6, 7], 3)])
def test_meter_cross_node_bytes_equal_plan_in_a_subgroup(pool, members, rpn):
    """[1, 3, 5, 7] on nodes of 2: every ring edge crosses, and hierarchical's blocks of 2 group
    ranks are themselves split over two nodes; [4..7] on nodes of 3: blocks and nodes disagree."""
    bad = _flatten(pool.run(_subgroup, members, rpn, world=8, timeout=60))
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"


def _pipeline_p2p(_world, members, rpn):
    """Each member sends to the next (ring order) and receives from the previous, via `post`."""
    g = dist.new_group(members)
    try:
        if dist.get_rank() not in members:
            return None
        n, r = len(members), dist.get_rank(g)
        right, left = (r + 1) % n, (r - 1) % n
        out, inc = torch.ones(100 + r), torch.empty(100 + left)
        with comm.configure(ranks_per_node=rpn), comm.TrafficMeter() as m:
            sends, recvs = point_to_point.post(sends=[(right, out)], recvs=[(left, inc)], group=g, tag=3)
            for w in sends + recvs:
                w.wait()
        t = m.get("send_recv", "p2p")
        node = [q // rpn for q in members]
        return ((t.cross_node_bytes_sent, t.cross_node_bytes_recv),
                (4 * (100 + r) * (node[right] != node[r]), 4 * (100 + left) * (node[left] != node[r])))
    finally:
        dist.destroy_process_group(g)


def test_pipeline_point_to_point_attributes_cross_node_bytes(pool):
    results = [x for x in pool.run(_pipeline_p2p, [0, 2, 3, 5, 6], 2, world=8, timeout=60) if x]
    assert len(results) == 5 and all(got == want for got, want in results), results
    assert any(got[0] for got, _ in results) and any(got[0] == 0 for got, _ in results)


def _held(fn):
    """Run fn() with link_emulator.transmit recorded; returns (bytes held back per message, wall s,
    CPU s of this process)."""
    held, real = [], link_emulator.transmit

    def spy(link, nbytes, dst=None):
        held.append(nbytes)
        real(link, nbytes, dst)

    link_emulator.transmit = spy
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        return held, time.perf_counter() - t0, time.process_time() - c0
    finally:
        link_emulator.transmit = real


MB = 1_000_000


def _delay(g):
    """World 4, nodes {0, 1} and {2, 3}: 1 sends 1 MB to 2 (another node), 0 sends 1 MB to 1 (its own)."""
    r = dist.get_rank(g)
    buf = torch.ones(MB // 4)
    with comm.configure(ranks_per_node=2, inter_node_gbps=0.01):  # 1 MB takes 0.1 s
        dist.barrier(group=g)

        def step():
            sends = [(r + 1, buf)] if r in (0, 1) else []
            recvs = [(r - 1, torch.empty(MB // 4))] if r in (1, 2) else []
            s, rv = point_to_point.post(sends=sends, recvs=recvs, group=g)
            for w in s + rv:
                w.wait()
        return _held(step)


def test_emulator_delays_cross_node_messages_without_burning_cpu(pool):
    (held0, _, _), (held1, wall1, cpu1), (held2, _, _), (held3, _, _) = pool.run(_delay, world=4, timeout=60)
    assert held0 == [] and held2 == [] and held3 == []  # intra-node send and receives: no delay
    assert held1 == [MB]
    assert wall1 >= 0.09, wall1  # lower bound only: the link was emulated
    assert cpu1 < wall1 / 4, (cpu1, wall1)  # it slept; it did not spin


def _incast(g):
    """World 4, one rank per node: ranks 1-3 each send 1 MB to rank 0 at once over 0.01 GB/s links."""
    r = dist.get_rank(g)
    with comm.configure(ranks_per_node=1, inter_node_gbps=0.01):   # 1 MB takes 0.1 s on a link
        dist.barrier(group=g)
        t0 = time.perf_counter()
        sends = [(0, torch.ones(MB // 4))] if r else []
        recvs = [(p, torch.empty(MB // 4)) for p in (1, 2, 3)] if r == 0 else []
        s, rv = point_to_point.post(sends=sends, recvs=recvs, group=g)
        for w in s + rv:
            w.wait()
        return time.perf_counter() - t0


def test_many_senders_share_the_receivers_link(pool):
    """Incast: three 1 MB messages into one rank's 0.01 GB/s link take 0.3 s, not one link's 0.1 s
    (each sender's own link is free; the receiver's is the bottleneck)."""
    walls = pool.run(_incast, world=4, timeout=60)
    assert walls[0] >= 0.29, walls
    first, *_, last = sorted(walls[1:])
    assert last >= 0.29, walls                  # the last sender served waits for the two before it
    assert first <= last - 0.1, walls           # served one after another, not shared to the end (a busy core delays both)


def _collectives_held(g):
    """Under emulation every algorithm holds back exactly its cross-node bytes sent, and a naive
    broadcast from rank 0 (two messages to the other node) waits for both on one link."""
    n, r = dist.get_world_size(g), dist.get_rank(g)
    out = {}
    with comm.configure(ranks_per_node=2, inter_node_gbps=50.0, inter_node_latency_us=10.0):
        for coll, algo in CASES:
            held, _, _ = _held(lambda: run_once(coll, algo, g, n, r, 3001, 0))
            whole = 3001 if coll in ("all_reduce", "reduce", "broadcast", "all_to_all") else n * 3001
            call = call_for(coll, algo, n, whole, 4, ranks_per_node=2)
            out[coll, algo] = (sum(held), links.cross_node_bytes(call, r, list(range(n)), 2)[0])
    with comm.configure(ranks_per_node=2, inter_node_gbps=0.01, inter_node_latency_us=5000.0):
        x = torch.ones(MB // 16)  # 62.5 kB: 6.25 ms + 5 ms per message
        dist.barrier(group=g)
        held, wall, _ = _held(lambda: comm.broadcast(x, 0, algorithm="naive", group=g))
    return out, (held, wall)


def test_emulator_holds_back_exactly_the_cross_node_bytes(pool):
    results = pool.run(_collectives_held, world=4, timeout=60)
    for rank, (out, _) in enumerate(results):
        for case, (held, planned) in out.items():
            assert held == planned, (rank, case, held, planned)
    held, wall = results[0][1]
    assert held == [MB // 4, MB // 4]  # to ranks 2 and 3; rank 1 shares rank 0's node
    assert wall >= 2 * (0.00625 + 0.005) * 0.99, wall  # both messages, one after the other


def test_messages_add_up_to_the_volume_formulas():
    """`plan.comm.links` lists the very messages `plan.comm.volume` counts (bytes and wire messages)."""
    for coll, algo in CASES:
        for n in (2, 3, 4, 5, 8):
            for count in (1, 7, 300_007):
                whole = count if coll in ("all_reduce", "reduce", "broadcast", "all_to_all") else n * count
                for root in (sorted({0, n - 1}) if coll in ROOTED else [0]):
                    for k in [k for k in ((2, 3) if algo in NODE_AWARE else (None,)) if fits(algo, n, k)]:
                        call = call_for(coll, algo, n, whole, 4, root=root, ranks_per_node=k)
                        for r in range(n):
                            ms, v = links.messages(call, r), volume(call, r)
                            sent = [m for m in ms if m.src == r]
                            recv = [m for m in ms if m.dst == r]
                            assert (sum(m.nbytes for m in sent), sum(m.nbytes for m in recv),
                                    sum(m.pieces for m in sent), sum(m.pieces for m in recv)) == (
                                v.bytes_sent, v.bytes_recv, v.messages_sent, v.messages_recv), (coll, algo, n, r)


def test_plan_cross_node_bytes_by_hand():
    ring = call_for("all_reduce", "ring", 4, 4000, 1)
    # nodes {0, 1}, {2, 3}: only 1 -> 2 and 3 -> 0 cross, each carrying 2·3/4 of the buffer
    assert [links.cross_node_bytes(ring, r, [0, 1, 2, 3], 2) for r in range(4)] == [
        (0, 6000), (6000, 0), (0, 6000), (6000, 0)]
    # hierarchical: only the leaders 0 and 2 cross, in a ring of two: 2·1/2 of the buffer each way
    hier = call_for("all_reduce", "hierarchical", 4, 4000, 1, ranks_per_node=2)
    assert [links.cross_node_bytes(hier, r, [0, 1, 2, 3], 2) for r in range(4)] == [
        (4000, 4000), (0, 0), (4000, 4000), (0, 0)]
    # hierarchical_2d: ranks 0 and 2 (local index 0) sum piece 0 across, 1 and 3 piece 1; every rank
    # sends and receives 2·1/2 of its 2000-byte piece over its own link
    two_d = call_for("all_reduce", "hierarchical_2d", 4, 4000, 1, ranks_per_node=2)
    assert [links.cross_node_bytes(two_d, r, [0, 1, 2, 3], 2) for r in range(4)] == [(2000, 2000)] * 4
    assert links.cross_node_bytes(ring, 0, [0, 1, 2, 3], None) == (0, 0)
    # the α-β time: 6 steps of 1000 B against 2 steps of 2000 B, plus one latency per message
    assert links.emulated_seconds(ring, range(4), 2, 1.0, 1.0) == pytest.approx(6 * (1e-6 + 1000 / 1e9))
    assert links.emulated_seconds(hier, range(4), 2, 1.0, 1.0) == pytest.approx(2 * (1e-6 + 2000 / 1e9))
    assert links.emulated_seconds(two_d, range(4), 2, 1.0, 1.0) == pytest.approx(2 * (1e-6 + 1000 / 1e9))
    assert links.link_seconds(2_000_000, 3, 2.0, 10.0) == pytest.approx(3e-5 + 1e-3)


def test_plan_rejects_unmodelled_algorithms():
    """The backend's own collective is not seen message by message."""
    with pytest.raises(ValueError, match="'torch'.*modelled: naive, ring, tree, butterfly, rabenseifner, "
                                         "hierarchical, hierarchical_2d$") as e:
        links.cross_node_bytes(call_for("all_reduce", "torch", 4, 100), 0, [0, 1, 2, 3], 2)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields, words", [
    (dict(inter_node_gbps=0), "inter_node_gbps"), (dict(inter_node_gbps=-1.0), "inter_node_gbps"),
    (dict(inter_node_gbps=float("inf")), "inter_node_gbps"), (dict(inter_node_gbps=True), "inter_node_gbps"),
    (dict(inter_node_latency_us=-0.5), "inter_node_latency_us"),
    (dict(inter_node_latency_us=float("nan")), "inter_node_latency_us"),
])
def test_config_rejects_bad_links(fields, words):
    with pytest.raises(ValueError, match=words) as e:
        CommConfig(**fields)
    assert "\n" not in str(e.value)


def test_config_accepts_links_and_resolves_nodes(monkeypatch):
    cfg = CommConfig(inter_node_gbps=12.5, inter_node_latency_us=3)
    assert link_emulator.link_for(cfg) == link_emulator.Link(12.5e9, 3e-6)
    assert link_emulator.link_for(CommConfig()) is None
    monkeypatch.delenv("RINGZERO_RANKS_PER_NODE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert CommConfig().world_node_size() is None and CommConfig().node_size(6) == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert CommConfig().world_node_size() == 4 and CommConfig().node_size(3) == 3
    assert CommConfig(ranks_per_node=2).world_node_size() == 2


def _partial_node(g):
    with comm.configure(ranks_per_node=2):
        try:
            comm.all_reduce(torch.ones(8), group=g, algorithm="hierarchical_2d")
        except ValueError as e:
            return str(e)
    return "no error"


def test_hierarchical_2d_refuses_a_partial_node_on_every_rank(pool):
    """3 ranks, 2 per node: the 2D all-reduce cannot pair local indices; each rank raises the same
    one-line error before sending anything (so none waits on a peer), and the pool serves on."""
    errors = pool.run(_partial_node, world=3, timeout=60)
    assert len(set(errors)) == 1 and "needs full nodes" in errors[0] and "\n" not in errors[0], errors
    assert not fits("hierarchical_2d", 3, 2) and fits("hierarchical_2d", 4, 2) and fits("ring", 3, 2)
