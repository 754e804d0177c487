"""The traffic meter equals the planner's formula, byte for byte, for every algorithm and world.

Per rank, for every (collective, algorithm), world size and root, bytes sent and
received, messages, rounds and bytes reduced measured by `TrafficMeter` equal
`ringzero.plan.comm.volume.volume` exactly, including counts not divisible by the world size.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ringzero import comm
from ringzero.plan.comm.volume import call_for, volume
from ringzero.comm.registry import TABLE
from ringzero.plan.comm.algorithms import NODE_AWARE, fits

from collective_cases import run_once

WORLDS = (2, 3, 4, 5, 7, 8)
COUNTS = (1, 6, 1001, 300_007)  # 300_007 float32 spans several 1 MiB ring segments per chunk


def _measure(g, coll, algo, n, r, count, root):
    """Run one call under a meter; return (measured, planned) volumes."""
    with comm.TrafficMeter() as m:
        run_once(coll, algo, g, n, r, count, root)
    measured = m.get(coll, algo).figures()  # what a formula gives: no calls, no cross-node split
    whole = count if coll in ("all_reduce", "reduce", "broadcast", "all_to_all") else n * count
    call = call_for(coll, algo, n, whole, 4, root=root, ranks_per_node=comm.get_config().node_size(n))
    return measured, volume(call, r)


def _check(group, coll, algo, rpn):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    bad = []
    roots = sorted({0, n - 1}) if coll in ("reduce", "broadcast", "gather", "scatter") else [0]
    with comm.configure(ranks_per_node=rpn):
        for count in COUNTS:
            for root in roots:
                measured, planned = _measure(group, coll, algo, n, r, count, root)
                if measured != planned:
                    bad.append(f"{coll}/{algo} n={n} rank={r} count={count} root={root}: "
                               f"meter {measured} != plan {planned}")
    return bad


CASES = [(c, a, None) for c, algos in TABLE.items() for a in algos if a not in NODE_AWARE]
CASES += [("all_reduce", "hierarchical", k) for k in (2, 3)] + [("all_reduce", "hierarchical_2d", 2)]


@pytest.mark.parametrize("coll,algo,rpn", CASES, ids=[f"{c}-{a}-{k}" for c, a, k in CASES])
def test_meter_equals_plan(pool, coll, algo, rpn):
    for world in [w for w in WORLDS if fits(algo, w, rpn)]:
        bad = [b for rank_bad in pool.run(_check, coll, algo, rpn, world=world) for b in rank_bad]
        assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"
