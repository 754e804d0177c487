"""`ringzero simulate collective`: nccl-tests' columns, the JSON rows, "auto", bad input (one line,
exit 2, before anything is played) and a million GPUs answered or refused with the bound."""

from __future__ import annotations

import json

import pytest

from ringzero import cli
from ringzero.plan.comm.schedule.build import MAX_LISTED
from ringzero.plan.comm.schedule.step import MAX_FLOWS
from ringzero.plan.comm.volume import bus_factor
from ringzero.simulate.collective import simulate
from ringzero.simulate.topology import preset

BASE = ["simulate", "collective"]


def _main(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _rows(argv, capsys) -> list[dict]:
    code, out, err = _main([*BASE, *argv, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)["rows"]


def test_the_table_has_nccl_tests_columns(capsys):
    code, out, _ = _main([*BASE, "--gpus", "16", "--algorithm", "ring", "--sizes", "1M,64M"], capsys)
    assert code == 0
    for column in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "busiest link"):
        assert column in out
    assert "1048576" in out and "16777216" in out and "float32" in out


def test_the_json_rows_are_the_simulation_with_nccl_tests_bus_factor(capsys):
    rows = _rows(["--gpus", "32", "--topology", "dgx-a100", "--algorithm", "hierarchical_2d", "--sizes", "64M,1G",
                  "--dtype", "bfloat16"], capsys)
    for r, size in zip(rows, (64 << 20, 1 << 30)):
        played = simulate("all_reduce", "hierarchical_2d", preset("dgx-a100", 32), size, 2)
        assert r["time_us"] == pytest.approx(played.seconds * 1e6, rel=1e-12)
        assert r["algbw"] == pytest.approx(size / played.seconds / 1e9, rel=1e-12)
        assert r["busbw"] == pytest.approx(r["algbw"] * bus_factor("all_reduce", 32), rel=1e-12)
        assert r["count"] == size // 2 and r["type"] == "bfloat16" and 0 < r["link_util"] <= 1


def test_auto_keeps_the_fastest_algorithm_per_size(capsys):
    rows = _rows(["--gpus", "64", "--sizes", "8K,1G"], capsys)
    for r in rows:
        for alg in ("ring", "tree", "hierarchical", "hierarchical_2d", "rabenseifner"):
            assert r["time_us"] <= simulate("all_reduce", alg, preset("dgx-h100", 64), r["size"]).seconds * 1e6 + 1e-9
    assert rows[0]["algorithm"] != "ring" and rows[1]["algorithm"] != "tree"


def test_overrides_reach_the_topology(capsys):
    fast, slow = (_rows(["--gpus", "16", "--algorithm", "ring", "--sizes", "1G", "--nic-bw", bw], capsys)[0]
                  for bw in ("400Gbit/s", "100Gbit/s"))
    assert slow["time_us"] > 3.5 * fast["time_us"]
    shared = _rows(["--gpus", "16", "--algorithm", "hierarchical_2d", "--sizes", "1G", "--nics-per-node", "1"], capsys)
    assert shared[0]["busiest_link"].startswith("nic")


@pytest.mark.parametrize("argv,message", [
    (["--gpus", "12"], "--gpus 12 is not a multiple of the 8 GPUs per node"),
    (["--gpus", "16", "--gpus-per-node", "3", "--algorithm", "ring"], "not a multiple of the 3 GPUs per node"),
    (["--gpus", "12", "--gpus-per-node", "6", "--algorithm", "hierarchical_2d", "--nics-per-node", "6"], None),
    (["--gpus", "4", "--algorithm", "hierarchical_2d"], None),     # half a node: one node of 4
    (["--nic-bw", "0"], "--nic-bw must be > 0"),
    (["--nvlink-bw", "-5GB/s"], "--nvlink-bw must be > 0"),
    (["--oversubscription", "x"], "--oversubscription='x': expected a number"),
    (["--sizes", "1M,abc"], "bad size 'abc' for --sizes"),
    (["--sizes", ","], "--sizes needs at least one value"),
    (["--sizes", "3", "--dtype", "float32"], "size 3 is not a whole number of float32 elements"),
    (["--topology", "dgx-b200"], "unknown topology 'dgx-b200'; allowed: dgx-a100, nd-a100-v4, dgx-h100, dgx-h200"),
    (["--algorithm", "pairwise"], "unknown algorithm 'pairwise' for all_reduce; allowed: naive, ring"),
    (["--collective", "all_reduces"], "unknown collective 'all_reduces'"),
    (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--gpus", "1"], "--gpus must be >= 2"),
    (["--straggler", "70:2"], "--straggler 70:2: GPU 70 is outside the world 0..63"),
    (["--straggler", "3:0.5"], "the factor must be >= 1 (a slower GPU)"),
    (["--straggler", "3"], "--straggler '3': expected GPU:FACTOR"),
    (["--degrade", "nic9.0:2"], "no link 'nic9.0' on 64 GPUs; allowed: gpu0..gpu63, nic0.0..nic7.7, leaf0..leaf7"),
    (["--degrade", "nic1.0:0"], "--degrade nic1.0:0.0: the factor must be >= 1"),
    (["--gpus", "1000000", "--algorithm", "rabenseifner"], f"needs 20,874,368 flows in its schedule, more than the "
                                                            f"{MAX_FLOWS:,} the simulator holds"),
    (["--gpus", "2048", "--collective", "broadcast", "--algorithm", "scatter_allgather"],
     f"more than the {MAX_LISTED:,} the simulator holds"),
    (["--gpus", "1000000", "--collective", "all_to_all", "--algorithm", "pairwise"],
     "all_to_all with pairwise on 1,000,000 ranks needs 999,999,000,000 flows"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    code, out, err = _main([*BASE, *argv], capsys)
    if message is None:                                 # a valid corner: 2 nodes of 6
        assert code == 0, err
        return
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert message in err


def test_a_million_gpu_ring_is_answered(capsys):
    rows = _rows(["--gpus", "1000000", "--algorithm", "ring", "--sizes", "1G"], capsys)
    assert rows[0]["steps"] == 2 * 999_999 and rows[0]["played"] == 2 and not rows[0]["exact"]


def test_a_straggler_and_a_degraded_link_cost_what_they_slow(capsys):
    """A ring of 64 leaves node 3 through GPU 31's NIC (nic3.7): at a quarter of its capacity each
    of the 126 steps' crossings takes 4x (the bandwidth term dominates at 1 GiB); GPU 26 sends
    inside its node at 450 GB/s, twice slower still faster than the 50 GB/s crossing: no cost."""
    ring = ["--gpus", "64", "--algorithm", "ring", "--sizes", "1G"]
    nic = _rows([*ring, "--degrade", "nic3.7:4"], capsys)[0]
    assert 3.5 < nic["slowdown"] < 4.0 and nic["busiest_link"] == "nic3.7 tx"
    assert nic["time_us"] == pytest.approx(nic["slowdown"] * nic["healthy_us"], rel=1e-12)
    assert _rows([*ring, "--straggler", "26:2"], capsys)[0]["slowdown"] == pytest.approx(1.0, rel=1e-12)
    assert 1.9 < _rows([*ring, "--straggler", "31:2"], capsys)[0]["slowdown"] <= 2.0


def test_auto_leaves_out_the_algorithms_past_the_bound(capsys):
    """scatter_allgather's ring all-gather is listed, n(n-1) messages: past the bound at 2,048."""
    code, out, err = _main([*BASE, "--collective", "broadcast", "--gpus", "2048", "--sizes", "1G", "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["skipped"] == ["scatter_allgather"] and got["rows"][0]["algorithm"] == "tree"


@pytest.mark.parametrize("gpus, size", [(64, 8 << 10), (64, 1 << 30), (1024, 1 << 20), (1024, 1 << 30)])
def test_auto_answers_as_playing_every_candidate_and_plays_fewer(gpus, size):
    """Branch and bound over the schedules (`simulate.auto`): the algorithm and time of playing every
    candidate and keeping the fastest, with every candidate's lower bound at or under its play, and
    the candidates whose bound exceeds the winner's time never played."""
    from ringzero.simulate.auto import fastest
    from ringzero.simulate.collective import candidates
    topo = preset("dgx-h100", gpus)
    algs = candidates("all_reduce", topo)
    every = {a: simulate("all_reduce", a, topo, size).seconds for a in algs}
    won = min(algs, key=lambda a: (every[a], algs.index(a)))
    got = fastest("all_reduce", algs, topo, size)
    assert got.algorithm == won and got.played.seconds == pytest.approx(every[won], rel=1e-12)
    assert all(got.bounds[a] <= every[a] * (1 + 1e-9) for a in algs), (got.bounds, every)
    assert set(got.compared) == {a for a in algs if got.bounds[a] <= every[won]}


def test_auto_at_16384_gpus_plays_few_schedules():
    """The count behind answering in under 2 s (timed in benchmarks/bench_simulate.py): of the
    candidates at 16,384 GPUs, a 1 MiB all-reduce plays at most two."""
    from ringzero.simulate.auto import fastest
    from ringzero.simulate.collective import candidates
    topo = preset("dgx-h100", 16384)
    algs = candidates("all_reduce", topo)
    got = fastest("all_reduce", algs, topo, 1 << 20)
    assert len(algs) >= 4 and len(got.compared) <= 2, got.compared


def test_a_long_simulation_shows_progress_on_a_terminal_only(monkeypatch, capsys):
    """The display is armed for a terminal and never under --quiet or --json; once armed and past
    its delay, a bar runs until the answer is printed."""
    from ringzero.commands import progress
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    armed = []
    real_init = progress.Shown.__init__

    def init(self, what, total, enabled):
        real_init(self, what, total, enabled)
        armed.append(enabled)
    monkeypatch.setattr(progress.Shown, "__init__", init)
    for extra, want in (([], True), (["--quiet"], False), (["--json"], False)):
        armed.clear()
        assert cli.main(["simulate", "collective", "--gpus", "64", "--sizes", "1G", *extra]) == 0
        assert armed == [want], extra
    capsys.readouterr()
    shown = progress.Shown("simulating", 2, True)
    shown._timer.cancel()
    shown._start()                         # what the timer does after AFTER_S
    shown.advance("1 GiB")
    assert shown.bar is not None and shown.bar.tasks[0].description == "simulating: 1 GiB"
    shown.close()
