"""`ringzero plan` answers for any GPU count: the traffic formulas are closed forms over `Chunks`
(never a per-rank list), the search tries O(max_tp + layers) splits, and the busiest rank of a
folded algorithm is the one that does the folded rank's work."""

from __future__ import annotations

import pytest

from ringzero import cli
from ringzero.plan.comm import chunks
from ringzero.plan.comm import volume as comm_volume
from ringzero.plan.comm.algorithms import fits
from ringzero.plan.comm.volume import MODULES, busiest, call_for, volume

LIMIT = 10_000
"""Longest per-rank list a plan may build (the real ones hold a node or the layers)."""


@pytest.fixture
def no_per_rank_lists(monkeypatch):
    """Fail the test if anything lists the chunks of a group larger than LIMIT."""
    real_iter, real_listed = chunks.Chunks.__iter__, chunks.Listed.__init__

    def guarded_iter(self):
        assert self.n <= LIMIT, f"listed the {self.n:,} chunks of one call"
        return real_iter(self)

    def guarded_listed(self, sizes):
        assert len(sizes) <= LIMIT, f"listed {len(sizes):,} chunk sizes"
        real_listed(self, sizes)

    monkeypatch.setattr(chunks.Chunks, "__iter__", guarded_iter)
    monkeypatch.setattr(chunks.Listed, "__init__", guarded_listed)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gpus", ["1000000000", "16700000", "16777216"])
@pytest.mark.parametrize("extra", [[], ["--search", "--top", "2"], ["--zero", "3"], ["--dp-algorithm", "naive"]])
def test_plan_answers_for_millions_of_gpus(capsys, no_per_rank_lists, gpus, extra):
    code = cli.main(["plan", "--model", "llama-2-7b", "--gpus", gpus, *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Communication per GPU per step" in out.out


@pytest.mark.timeout(60)
def test_every_formula_is_closed_form_for_a_billion_ranks(no_per_rank_lists):
    n = 10**9
    for (collective, algorithm) in MODULES:
        if collective == "all_to_all":          # a matrix of n x n messages: inherently per rank
            continue
        for count in (n * 3 + 7, n // 3, 5) if collective in comm_volume.WHOLE_BUFFER else (n * 4,):
            call = call_for(collective, algorithm, n, count, 2, root=n - 1, ranks_per_node=8)
            for rank in (0, 1, n // 2 + 3, n - 1):
                v = volume(call, rank)
                assert v.bytes_sent >= 0 and v.rounds >= 0


@pytest.mark.parametrize("collective,algorithm", [k for k in MODULES if k[0] != "all_to_all"])
def test_closed_forms_equal_the_formulas_over_listed_chunks(collective, algorithm):
    """The closed form over `Chunks` gives, for every rank, exactly what the same formula gives
    over the explicit list of chunk sizes (`Listed`), including counts below the world size."""
    import dataclasses
    for n in [n for n in range(1, 12) if fits(algorithm, n, 3)]:
        for count in (0, 1, n - 1, n + 1, 7 * n + 3):
            if collective not in comm_volume.WHOLE_BUFFER:
                count = n * (count // n + 1)
            for root in {0, n - 1}:
                call = call_for(collective, algorithm, n, count, 4, root=root, ranks_per_node=3)
                listed = dataclasses.replace(call, sizes=tuple(call.sizes))
                for rank in range(n):
                    assert volume(call, rank) == volume(listed, rank), (n, count, root, rank)


def test_chunks_answer_like_the_list():
    for n in (1, 3, 8, 13):
        for count in (0, 1, n - 1, n, 5 * n + 2):
            c, listed = chunks.Chunks(count, n), chunks.chunk_sizes(count, n)
            assert list(c) == listed and len(c) == n and c.total == count
            assert [c[i] for i in range(-n, n)] == listed + listed
            bounds = chunks.bounds_from_sizes(listed)
            assert [c.bound(i) for i in range(n + 1)] == bounds
            assert all(c.span(lo, hi) == sum(listed[lo:hi]) for lo in range(n + 1) for hi in range(lo, n + 1))
            assert c.histogram() == chunks.Listed(tuple(listed)).histogram()
            assert c.nonempty() == chunks.Listed(tuple(listed)).nonempty()


@pytest.mark.parametrize("collective,algorithm", [k for k in MODULES if k[0] != "all_to_all"])
def test_busiest_rank_moves_the_most(collective, algorithm):
    """`busiest` has the most rounds and, up to one element per chunk sent, the most bytes on its
    busier direction (what the time model prices)."""
    for n in [n for n in range(2, 18) if fits(algorithm, n, 3)]:
        count = 1000 * n + 7 if collective in comm_volume.WHOLE_BUFFER else 1000 * n
        call = call_for(collective, algorithm, n, count, 4, root=0, ranks_per_node=3)
        vols = [volume(call, r) for r in range(n)]
        b = vols[busiest(call)]
        assert b.rounds == max(v.rounds for v in vols), (n, busiest(call))
        slack = 4 * 2 * n
        most = max(max(v.bytes_sent, v.bytes_recv) for v in vols)
        assert max(b.bytes_sent, b.bytes_recv) >= most - slack, (n, busiest(call))
