"""This machine as a simulated cluster (`simulate.local`): the link emulator's NICs as a topology,
played, against the planner's emulated time and against ringzero's collectives measured on ranks
under the emulator."""

import statistics
import time

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import select
from ringzero.plan.comm import links
from ringzero.plan.comm.volume import call_for
from ringzero.simulate import local

ALGORITHMS = ("ring", "tree", "hierarchical", "hierarchical_2d")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("count", [3001, 1 << 18])
def test_the_played_links_are_the_planners_emulated_time(algorithm, n, count):
    # no two crossings of a step share a NIC here, so the fluid play is the planner's per-step sum;
    # the planner charges α per wire piece, the emulator (and the play) once per message: <= 2 % apart
    sim = local.link_seconds("all_reduce", algorithm, n, count, 4, 2, 1.0, 20.0)
    planned = links.emulated_seconds(call_for("all_reduce", algorithm, n, count, 4, ranks_per_node=2),
                                     range(n), 2, 1.0, 20.0)
    assert sim == pytest.approx(planned, rel=0.02) and sim > 0


def test_one_node_has_no_link_time_and_ranks_must_fill_nodes():
    assert local.link_seconds("all_reduce", "ring", 2, 1 << 18, 4, 2, 1.0, 20.0) < 1e-8     # the free NVSwitch only
    with pytest.raises(ValueError, match="6 ranks are not whole nodes of 4"):
        local.emulated_topology(6, 4, 1.0, 0.0)


# 1 MiB over 0.01 GB/s: the links take 50-210 ms, the host (priced by the built-in defaults) a few
GBPS, LATENCY_US, COUNT = 0.01, 50.0, 1 << 18


def _timed(g):
    """Median wall time of each algorithm's 1 MiB all-reduce under the emulator, slowest rank's view."""
    out = {}
    with comm.configure(ranks_per_node=2, inter_node_gbps=GBPS, inter_node_latency_us=LATENCY_US):
        for alg in ALGORITHMS:
            x, walls = torch.ones(COUNT), []
            for _ in range(3):
                dist.barrier(group=g)
                t0 = time.perf_counter()
                comm.all_reduce(x, algorithm=alg, group=g)
                walls.append(time.perf_counter() - t0)
            out[alg] = statistics.median(walls)
    return out


@pytest.mark.timeout(120)
def test_ringzeros_collectives_under_the_emulator_take_the_simulated_time(pool):
    """The emulator holds every cross-node message for its link time and a busy core only adds to
    the host's part, so no run is faster than the simulation by more than the simulator's error
    (15 %); how close it comes from above, on a quiet machine, is `benchmarks/bench_simulate_engine.py`'s."""
    measured = pool.run(_timed, world=4, timeout=90)
    bad = []
    for alg in ALGORITHMS:
        got = max(m[alg] for m in measured)
        link = local.link_seconds("all_reduce", alg, 4, COUNT, 4, 2, GBPS, LATENCY_US)
        host = select.price("all_reduce", alg, 4, COUNT * 4, 2, None)            # the built-in defaults
        sim = local.seconds("all_reduce", alg, 4, COUNT, 4, 2, GBPS, LATENCY_US, host)
        assert host + link >= sim > link > 0.5 * sim
        print(f"{alg}: measured {got * 1e3:.1f} ms, simulated {sim * 1e3:.1f} ms, host + links {(host + link) * 1e3:.1f}")
        if got < 0.85 * sim:                  # faster than the emulated links allow
            bad.append(f"{alg}: measured {got * 1e3:.1f} ms, simulated {sim * 1e3:.1f} ms")
    assert not bad, bad
