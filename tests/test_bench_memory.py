"""`ringzero bench comm`'s memory rule (`bench.comm_memory`) against what its ranks hold: the cell's
buffers on every rank, the scratch every algorithm asks for, the peak resident memory of a large
cell, and a large all-reduce that the rule lets run where it fits."""

from __future__ import annotations

import math
import os

import pytest
import torch

from ringzero import comm
from ringzero.bench import comm_memory
from ringzero.bench.comm_ranks import Cell, Job, element_count, measure_cell
from ringzero.comm import p2p, registry
from cli_errors import forbid_ranks, refused

GIB, MIB = 2**30, 2**20


def test_every_collective_and_algorithm_has_its_rule():
    assert set(comm_memory.BUFFERS) == set(registry.COLLECTIVES)
    assert set(comm_memory.SCRATCH) == {(c, a) for c in registry.COLLECTIVES for a in registry.algorithms(c) + ("torch",)}


def test_an_all_reduce_holds_three_buffers_and_its_algorithms_scratch():
    # nccl-tests' three (send, receive, expected) and a ring's chunk; the naive root takes n - 1 more
    assert comm_memory.factor([("all_reduce", ("ring",))], [4]) == 3.25
    assert comm_memory.factor([("all_reduce", ("auto",))], [4]) == 3 + 3
    assert comm_memory.factor([("all_reduce", ("ring",)), ("all_to_all", ("pairwise",))], [2, 4]) == 5


def _held(t) -> dict:
    return {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in (t if isinstance(t, list) else [t])
            if isinstance(x, torch.Tensor)}


def _cell_and_scratch(group, cases, count_bytes: int) -> dict:
    """Per (collective, algorithm): this rank's cell buffers and the most scratch one call took,
    in bytes, and the cell's whole buffer."""
    seen, taken = {}, [0]
    empty = p2p.TorchComm.empty

    def counting(self, n):
        self._asked = getattr(self, "_asked", 0) + n
        taken[0] = max(taken[0], self._asked * self.itemsize)
        return empty(self, n)

    p2p.TorchComm.empty = counting
    try:
        with comm.configure(checks=False, arena_max_bytes=None):
            for collective, algorithms in cases:
                count = element_count(collective, count_bytes, 4, group.size())
                cell = Cell(collective, group, count, torch.float32)
                held = {}
                for name in ("buf", "fresh", "expect", "inp", "out", "outs", "ins"):
                    held.update(_held(getattr(cell, name, None)))
                for a in algorithms:
                    taken[0] = 0
                    cell.reset()
                    cell.call(a)
                    seen[collective, a] = (sum(held.values()), taken[0], count * 4)
    finally:
        p2p.TorchComm.empty = empty
    return seen


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_no_rank_holds_more_than_the_rule_says(pool, world):
    cases = [(c, registry.algorithms(c)) for c in registry.COLLECTIVES]
    ranks = pool.run(_cell_and_scratch, cases, 3 * 5 * 7 * 64 * 4, world=world)
    for (collective, algorithm), _ in ranks[0].items():
        rows = [r[collective, algorithm] for r in ranks]
        whole = rows[0][2]
        slack = 4 * 16 * world      # bytes: chunks rounded up to whole elements, a 5-element period's tail
        buffers = comm_memory.BUFFERS[collective](world) * whole
        assert max(b for b, _, _ in rows) <= buffers + slack, (collective, rows)
        assert max(b for b, _, _ in rows) >= buffers - slack, (collective, rows)   # the rule is the busiest rank's
        scratch = comm_memory.SCRATCH[collective, algorithm](world) * whole
        assert max(s for _, s, _ in rows) <= scratch + slack, (collective, algorithm, rows)


def _peak_growth(group, collective: str, nbytes: int) -> float:
    """Peak resident memory this rank gained over one cell of every algorithm, in bytes."""
    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    n = group.size()
    job = Job(worlds=(n,), cases=(), sizes=(nbytes,), dtype="float32", iters=1, warmup=0)
    algorithms = registry.algorithms(collective)
    with open("/proc/self/clear_refs", "w") as f:     # 5: reset VmHWM to the resident size now
        f.write("5")
    base = status("VmRSS")
    with comm.configure(checks=False, arena_max_bytes=None):
        measure_cell(group, collective, algorithms, element_count(collective, nbytes, 4, n), job)
    return status("VmHWM") - base


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="needs Linux's /proc/self/clear_refs to reset the peak")
def test_a_large_all_reduce_peaks_near_its_three_buffers(pool):
    """32 MiB of float32 on 2 ranks, every algorithm: the buffers (3) and the largest scratch (1),
    and the shared-memory channels, a few MiB whatever the size; the cell's int64 references, whole
    comparisons and fresh buffers per call once made it 13x the buffer."""
    rule = comm_memory.factor([("all_reduce", registry.algorithms("all_reduce"))], [2])
    assert rule == 4
    growth = pool.run(_peak_growth, "all_reduce", 32 * MIB, world=2)
    assert max(growth) <= rule * 32 * MIB + 16 * MIB, [g / MIB for g in growth]


def test_bench_comm_runs_a_512_mib_all_reduce_on_24_gb(tmp_path, monkeypatch, capsys):
    """The issue's case: 4 ranks of a 512 MiB all-reduce, every algorithm, fit in 24 GB (the rule
    once asked 32x the buffer a rank, 65 GB); 4 GiB buffers do not."""
    monkeypatch.chdir(tmp_path)
    forbid_ranks(monkeypatch)
    monkeypatch.setattr("ringzero.bench.comm_memory.available_bytes", lambda: 24 * 10**9)
    from ringzero import cli
    assert cli.main(["bench", "comm", "--collective", "all_reduce", "--sizes", "512MiB"]) == 1
    assert "a rank was about to start" in capsys.readouterr().err
    line = refused(capsys, tmp_path, ["bench", "comm", "--collective", "all_reduce", "--sizes", "4GiB"],
                   "4 ranks need about", "6 x the largest buffer")
    assert f"{4 * comm_memory.rank_bytes(4 * GIB, 6) / GIB:.1f} GiB" in line
    assert math.isclose(comm_memory.factor([("all_reduce", ("auto",))], [4]), 6)
