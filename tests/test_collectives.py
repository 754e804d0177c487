"""Every collective x algorithm x world size x element count x dtype x op, bit for bit.

The matrix: world sizes {1, 2, 3, 4, 8} (3 folds a non-power of two, as 5 and 7 would, at a large
share of the suite's time: 7 ranks on a 2-core machine; tests/test_meter.py runs 5 and 7; world 8 in
float32 only); counts 0, 1, n-1 and a large odd count;
float32, float64, bfloat16, float16, int32, int64 for the ring's all-reduce (the other reducing
algorithms, which share its reduction kernel, and the collectives that only move bytes take three of
them); every op the dtype allows; non-contiguous inputs;
roots 0 and n-1. All cases of one (collective, algorithm, world) run inside one pool job. World 7
runs in tests/test_meter.py (every algorithm's bytes against the planner's).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from collective_cases import case
from ringzero import comm
from ringzero.comm.ops import Op
from ringzero.comm.registry import TABLE
from ringzero.plan.comm.algorithms import NODE_AWARE, fits

WORLDS = (1, 2, 3, 4, 8)
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)
MOVING_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
REDUCING_DTYPES = (torch.float32, torch.bfloat16, torch.int64)
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("reduce", "broadcast", "gather", "scatter")
LARGE_ODD = 10007


def _ops(coll, dtype):
    if coll not in REDUCING:
        return [None]
    return [op for op in Op if op is not Op.AVG or dtype.is_floating_point]


def _run_matrix(group, coll, algo, ranks_per_node):
    n = dist.get_world_size(group)
    failures = []
    roots = sorted({0, n - 1}) if coll in ROOTED else [0]
    # Our wrapper of the backend ("torch") and "auto" (which only picks one of the algorithms
    # tested here in full) get a lighter sweep; a large odd count runs for float32 and int64.
    light = algo in ("torch", "auto")
    # Collectives that only move bytes see a dtype through its size alone: one of each size.
    # Every reducing algorithm shares one reduction kernel (`Comm.reduce`), tested for every dtype by
    # the ring's all-reduce: the others run one float, one 16-bit float and one integer type.
    # The ring's all-reduce runs all six dtypes; the other algorithms reduce with the same kernel.
    dtypes = ((torch.float32, torch.int64) if light else DTYPES if (coll, algo) == ("all_reduce", "ring")
              else REDUCING_DTYPES if coll in REDUCING else MOVING_DTYPES)
    # World 8 checks what only a deeper schedule has (a third round of halving or doubling, a tree
    # of depth 3) on every count, op and root, in float32: the dtypes go through the kernel that
    # worlds 2-4 test in full, and each world-8 case costs ~3x a world-4 one on 2 cores.
    if n >= 8:
        dtypes = (torch.float32,)
    with comm.configure(ranks_per_node=ranks_per_node):
        for dtype in dtypes:
            small = [(c, op) for c in sorted({0, 1, max(n - 1, 0), 5}) for op in _ops(coll, dtype)]
            large = [(LARGE_ODD, op) for op in _ops(coll, dtype)[:2]] if dtype in (torch.float32, torch.int64) else []
            for count, op in small + large:
                for root in roots:
                    failures.append(case(group, coll, algo, count, dtype, op, root, False))
        for root in roots:  # non-contiguous inputs (only the in-place collectives take one tensor)
            if coll in ("all_reduce", "reduce", "broadcast"):
                failures.append(case(group, coll, algo, 33, torch.float32, Op.SUM, root, True))
    return [f for f in failures if f]


CASES = [(c, a, None) for c, algos in TABLE.items() for a in algos if a not in NODE_AWARE]
CASES += [("all_reduce", "hierarchical", k) for k in (2, 3)]   # k = 1: a ring of leaders (test_meter)
CASES += [("all_reduce", "hierarchical_2d", 2)]  # world 2 is one node: its ring phases alone
CASES += [(c, "torch", None) for c in TABLE] + [(c, "auto", None) for c in TABLE]


@pytest.mark.parametrize("coll,algo,rpn", CASES, ids=[f"{c}-{a}-{k}" for c, a, k in CASES])
def test_collective_matches_torch(pool, coll, algo, rpn):
    for world in [w for w in WORLDS if fits(algo, w, rpn)]:  # 2D: full nodes (errors: test_links)
        results = pool.run(_run_matrix, coll, algo, rpn, world=world)
        bad = [f for rank_failures in results for f in rank_failures]
        assert not bad, f"world {world}: {len(bad)} failures, first: {bad[0]}"
