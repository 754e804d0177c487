"""NCCL's PXN in the topology: a message between rails moves over NVLink to its rail's GPU first,
so it stays on one rail and off an oversubscribed spine; nothing else is rerouted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ringzero import cli
from ringzero.simulate.fluid import play
from ringzero.simulate.topology import preset

MiB = 1 << 20


def _topo(pxn: bool, **over):
    # 2 DGX H100 nodes under one leaf group (both nodes' rail k on leaf k), a 4:1 spine
    return preset("dgx-h100", 16, nodes_per_leaf=32, oversubscription=4.0, switch_latency=1e-6, pxn=pxn, **over)


def _seconds(topo, src: int, dst: int, nbytes: float) -> float:
    links, latency = topo.routes(np.array([src]), np.array([dst]))
    return play(links, latency, np.array([nbytes]), topo.capacities()).seconds


def test_a_message_between_rails_takes_its_nvlink_hop_instead_of_the_spine():
    # GPU 7 of node 0 to GPU 0 of node 1: rail 7 to rail 0. Without PXN it crosses the spine, whose
    # uplink for 2 nodes at 4:1 is 2 x 50 GB/s / 4 = 25 GB/s; with PXN it goes GPU 7 -> GPU 0 over
    # NVLink (450 GB/s) and leaves by NIC 0 (50 GB/s), one rail end to end.
    plain, pxn = _topo(False), _topo(True)
    s = 64 * MiB
    assert _seconds(plain, 7, 8, s) == pytest.approx(s / 25e9 + plain.nic_latency + 1e-6, rel=1e-9)
    assert _seconds(pxn, 7, 8, s) == pytest.approx(s / 50e9 + pxn.nic_latency + pxn.nvlink_latency, rel=1e-9)
    links, _ = pxn.routes(np.array([7]), np.array([8]))
    names = {pxn.link_name(int(i)) for i in links[0] if i >= 0}
    assert names == {"gpu7 nvlink up", "gpu0 nvlink down", "nic0.0 tx", "nic1.0 rx"}


def test_messages_on_one_rail_and_inside_a_node_are_not_rerouted():
    plain, pxn = _topo(False), _topo(True)
    src, dst = np.array([3, 3, 12]), np.array([11, 5, 4])          # same rail across; inside a node; same rail back
    for a, b in zip(plain.routes(src, dst), pxn.routes(src, dst)):
        assert np.array_equal(a, b)


def test_pxn_needs_rails():
    with pytest.raises(ValueError, match="rail-optimised"):
        preset("dgx-h100", 16, rail_optimized=False, pxn=True)


def test_a_two_node_ring_on_an_oversubscribed_spine_is_faster_with_pxn(capsys):
    def busbw(*extra):
        code = cli.main(["simulate", "collective", "--gpus", "16", "--algorithm", "ring", "--sizes", "256M",
                         "--oversubscription", "4", "--json", *extra])
        assert code == 0
        return json.loads(capsys.readouterr().out)["rows"][0]["busbw"]

    plain, pxn = busbw(), busbw("--pxn")
    # the ring's two crossings (GPU 7 -> 8, GPU 15 -> 0) go rail 7 -> rail 0 through the spine
    # without PXN; with it they stay on rail 0 at a NIC's full bandwidth
    assert pxn > 1.5 * plain
    code = cli.main(["simulate", "collective", "--gpus", "16", "--pxn", "--shared-nic", "--sizes", "1M"])
    err = capsys.readouterr().err
    assert code == 2 and "rail-optimised" in err and len(err.strip().splitlines()) == 1
