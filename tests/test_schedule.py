"""A collective's schedule as data (`plan.comm.schedule`) is the real algorithm: every message the
real code sends on the explainer's symbolic ranks, (step, src, dst, bytes), equals the schedule's,
for every collective and algorithm at 2-16 ranks and counts of 0, fewer than the world, odd and
even; the compressed forms equal the listed ones up to 256 ranks; a schedule past the memory bound
is refused with its size."""

from __future__ import annotations

import numpy as np
import pytest

from ringzero.comm import registry, symbolic
from ringzero.comm.symbolic_values import Sym
from ringzero.plan.comm.algorithms import ALGORITHMS, fits
from ringzero.plan.comm.chunks import Chunks, chunk_bounds
from ringzero.plan.comm.schedule import asap
from ringzero.plan.comm.schedule.build import BUILDERS, MAX_LISTED, built, schedule, schedule_for
from ringzero.plan.comm.schedule.step import MAX_FLOWS, Step
from ringzero.plan.comm.volume import ROOTED, Call, call_for

CASES = [(c, a) for c, algs in ALGORITHMS.items() for a in algs]


def _rpn(algorithm: str) -> int | None:
    return 3 if algorithm.startswith("hierarchical") else None


def _call(collective, algorithm, n, count, root=0, segment_bytes=1 << 20) -> Call:
    if collective == "all_to_all":
        return call_for(collective, algorithm, n, count)
    return Call(collective=collective, algorithm=algorithm, n=n, sizes=Chunks(count, n), root=root,
                ranks_per_node=_rpn(algorithm), segment_bytes=segment_bytes)


def _symbolic(collective, algorithm, n, count, root):
    """The real algorithm's messages on n symbolic ranks, buffers of `count` elements."""
    bounds = chunk_bounds(count, n)

    def filled(r, size):
        buf = np.empty(size, dtype=object)
        for i in range(size):
            buf[i] = Sym.term(r, i)
        return buf

    def setup(r):
        if collective == "all_to_all":
            per = [bounds[r + 1] - bounds[r]] * n          # every rank sends its chunk r to rank r
            rbuf = np.empty(sum(per), dtype=object)
            return (filled(r, count), bounds, rbuf, [0] + list(np.cumsum(per))), rbuf
        buf = filled(r, count)
        return ((buf, bounds, root) if collective in ROOTED else (buf, bounds)), buf

    k = _rpn(algorithm)
    trace = symbolic.run(registry.resolve(collective, algorithm), n, setup, itemsize=4,
                         ranks_per_node=max(1, min(k or n, n)))
    return sorted((m.step, m.src, m.dst, 4 * len(m.contents)) for m in trace.messages if len(m.contents))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("collective,algorithm", CASES)
def test_the_schedule_is_what_the_real_code_sends(collective, algorithm):
    for n in range(2, 17):
        counts = (n, 0, n - 1, 3 * n + 1) if n in (3, 7, 12) else (n,)
        roots = (0, n - 1) if collective in ROOTED and n in (3, 7, 12) else (0,)
        for count in counts:
            if collective == "all_to_all" and count % n:
                continue
            for root in roots:
                if not fits(algorithm, n, _rpn(algorithm)):
                    continue
                real = _symbolic(collective, algorithm, n, count, root)
                mine = sorted(asap.schedule(_call(collective, algorithm, n, count, root)).messages())
                assert mine == real, (n, count, root)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algorithm", sorted(BUILDERS))
def test_the_built_schedule_plays_as_the_listed_one(algorithm):
    """Up to 256 ranks, uneven and short counts, several node sizes and roots, small segments."""
    collectives = [c for c in ALGORITHMS if algorithm in ALGORITHMS[c]]
    for n in [*range(2, 13), 31, 64, 256]:
        for k in ((3, 8) if algorithm.startswith("hierarchical") else (None,)):
            if not fits(algorithm, n, k):
                continue
            for count in ((0, 1, n - 1, n, 3 * n + 1, 1000) if n < 64 else (n - 1, 3 * n + 1)):
                for collective in collectives:
                    for root in ((0, n // 2) if collective in ROOTED else (0,)):
                        call = Call(collective=collective, algorithm=algorithm, n=n, sizes=Chunks(count, n),
                                    root=root, ranks_per_node=k, segment_bytes=64)
                        if not built(call):
                            assert algorithm != "ring" and (count < n or algorithm == "tree" or collective == "all_to_all")
                            continue
                        got, listed = BUILDERS[algorithm](call), asap.schedule(call)
                        where = (collective, n, k, count, root)
                        assert sorted(got.messages()) == sorted(listed.messages()), where
                        assert _pieces(got) == _pieces(listed), where


def _pieces(sched) -> list:
    out, at = [], 0
    for s in sched.steps:
        for i in range(s.repeat):
            at += 1
            sizes, pieces = s.sizes_at(i)
            out += [(at, a, b, p) for a, b, z, p in zip(s.src, s.dst, sizes, pieces) if z]
    return sorted(out)


def test_a_ring_of_16384_is_two_steps_of_16384_flows():
    sched = schedule(call_for("all_reduce", "ring", 16384, 2**28))
    assert [s.repeat for s in sched.steps] == [16383, 16383] and sched.stored == 2 * 16384
    assert all(s.uniform for s in sched.steps) and sched.count == 2 * 16383
    uneven = schedule(call_for("all_reduce", "ring", 3072, 2**28))      # 2^28 % 3 != 0: rolled
    assert uneven.stored == 2 * 3072 and not uneven.steps[0].uniform


def test_hierarchical_stores_one_flow_per_rank_and_step_shape():
    sched = schedule(call_for("all_reduce", "hierarchical", 16384, 2**28, ranks_per_node=8))
    assert sched.count == 3 + 2 * 2047 + 3 and sched.stored < 4 * 16384


def test_a_schedule_past_the_bound_is_refused_with_its_size():
    with pytest.raises(ValueError, match=f"pairwise on 1,000,000 ranks needs 999,999,000,000 flows .* "
                                         f"more than the {MAX_LISTED:,}"):
        schedule_for("all_to_all", "pairwise", 1_000_000, 1_000_000)
    with pytest.raises(ValueError, match=f"rabenseifner on 1,000,000 ranks needs 20,874,368 flows .* than the {MAX_FLOWS:,}"):
        schedule_for("all_reduce", "rabenseifner", 1_000_000, 1_000_000)      # 2·19·2^19 + 2·475,712
    with pytest.raises(ValueError, match=f"rabenseifner on 1,000,000 ranks needs at least [0-9,]+ flows .* than the {MAX_LISTED:,}"):
        schedule_for("all_reduce", "rabenseifner", 1_000_000, 999_999)        # an empty chunk: listed
    with pytest.raises(ValueError, match=f"hierarchical_2d on {2 * MAX_FLOWS:,} ranks needs at least {2 * MAX_FLOWS:,}"):
        schedule_for("all_reduce", "hierarchical_2d", 2 * MAX_FLOWS, 4 * MAX_FLOWS, ranks_per_node=8)
    big_tree = schedule_for("all_reduce", "tree", 1 << 17, 1 << 17)      # built along the tree: 2(n-1)
    assert big_tree.stored == 2 * ((1 << 17) - 1) and big_tree.count == 2 * 17


def test_a_rolled_step_rolls_its_sizes():
    s = Step((0, 1, 2), (1, 2, 0), (8, 4, 4), (1, 1, 1), repeat=3, roll=1)
    assert [s.sizes_at(i)[0] for i in range(3)] == [(8, 4, 4), (4, 8, 4), (4, 4, 8)]
    with pytest.raises(ValueError, match="one entry per flow"):
        Step((0,), (1, 2), (8,), (1,))
