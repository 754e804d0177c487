"""Collectives inside a group that excludes some ranks and renumbers the rest.

The pool's prefix groups {0..k-1} map group rank i to global rank i; here the group is global ranks
[6, 1, 4] (group ranks 0, 1, 2), so every algorithm must translate ranks, and ranks 0, 2, 3, 5, 7
must not be touched.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from collective_cases import case
from ringzero import comm
from ringzero.comm.ops import Op
from ringzero.comm.registry import TABLE

MEMBERS = [6, 1, 4]


def _in_subgroup(_world_group, coll, algos):
    group = dist.new_group(MEMBERS)  # every rank of the world must call new_group
    failures = []
    if dist.get_rank() in MEMBERS:
        op = Op.SUM if coll in ("all_reduce", "reduce", "reduce_scatter") else None
        with comm.TrafficMeter() as meter:
            for algo in algos:
                for count in (1, 7, 1001):
                    for root in (0, 2):
                        failures.append(case(group, coll, algo, count, torch.float32, op, root, False))
        traffic = meter.total()
    else:
        traffic = None
    dist.destroy_process_group(group)
    return [f for f in failures if f], traffic


@pytest.mark.parametrize("coll", list(TABLE))
def test_collectives_in_a_renumbered_subgroup(pool, coll):
    results = pool.run(_in_subgroup, coll, list(TABLE[coll]) + ["torch"])
    for rank, (failures, traffic) in enumerate(results):
        assert not failures, f"rank {rank}: {failures[0]}"
        if rank in MEMBERS:
            assert traffic.bytes_sent + traffic.bytes_recv > 0
        else:
            assert traffic is None
