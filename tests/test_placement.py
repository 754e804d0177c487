"""The rank grid: Megatron's order (tp fastest, then dp, then pp), its groups, nodes and errors."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringzero.plan.config import Parallel
from ringzero.plan.placement import Placement


def test_megatron_order_on_eight_ranks():
    p = Placement(dp=2, tp=2, pp=2)
    assert [tuple(p.coords(r).values()) for r in range(8)] == [
        (0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]
    assert p.group(("tp",), 5) == (4, 5)          # consecutive ranks
    assert p.group(("dp",), 5) == (5, 7)          # strides by tp
    assert p.group(("pp",), 5) == (1, 5)          # strides by dp·tp
    assert p.group(("dp", "tp"), 5) == (4, 5, 6, 7)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 16))
def test_groups_partition_the_grid(dp, tp, pp, per_node):
    p = Placement(dp=dp, tp=tp, pp=pp, ranks_per_node=per_node)
    for dims in (("tp",), ("dp",), ("pp",), ("dp", "tp")):
        groups = {p.group(dims, r) for r in range(p.world)}
        assert sorted(r for g in groups for r in g) == list(range(p.world))
        assert all(len(g) == math.prod(p.size(d) for d in dims) for g in groups)
    for r in range(p.world):
        assert p.rank(**p.coords(r)) == r
    for dim in ("tp", "dp", "pp"):          # members of a group inside one node: at most the group
        assert 1 <= p.node_size(dim) <= p.size(dim)


def test_planner_and_engine_share_the_placement():
    par = Parallel(dp=4, tp=2)
    assert par.placement(8).node_size("tp") == 2 and par.placement(8).node_size("dp") == 4
    assert par.placement(4).node_size("dp") == 2      # 4 ranks per node: dp pairs cross nodes


@pytest.mark.parametrize("kw, match", [
    (dict(world=6, tp=4), "not a multiple of tp x pp"),
    (dict(world=4, tp=8), "tp=8 is larger than the world of 4"),
    (dict(world=8, tp=2, dp=3), "dp x tp x pp = 3 x 2 x 1 = 6 must equal the world of 8"),
    (dict(world=4, pp=0), "pp must be >= 1"),
])
def test_bad_grids_are_one_line(kw, match):
    world = kw.pop("world")
    with pytest.raises(ValueError, match=match):
        Placement.for_world(world, **kw)
