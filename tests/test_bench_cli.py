"""`ringzero bench comm`: argument checking, the data check of every collective, one real CLI run."""

import json

import pytest
import torch

from ringzero import cli
from ringzero.bench import comm as bench
from ringzero.bench.comm_ranks import Cell, check, element_count
from ringzero.comm import registry
from ringzero.plan.comm import links
from ringzero.plan.comm.algorithms import NODE_AWARE
from ringzero.plan.comm.volume import call_for


def _main(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_parse_sizes():
    assert bench.parse_sizes("64KiB,1MiB") == (64 << 10, 1 << 20)
    assert bench.parse_sizes("4096, 2K,1.5M,1GB") == (4096, 2048, 3 << 19, 10 ** 9)
    for bad in ("12XB", "-1", "one", "0", ","):
        with pytest.raises(ValueError):
            bench.parse_sizes(bad)


def test_bus_bandwidth_factors_follow_nccl_tests():
    row = {"size": 10 ** 9, "time_us": 1e6, "world": 4}
    expect = {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "all_to_all": 0.75,
              "gather": 0.75, "scatter": 0.75, "broadcast": 1.0, "reduce": 1.0}
    for collective, factor in expect.items():
        assert bench.bandwidths({**row, "collective": collective}) == pytest.approx((1.0, factor))


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "12XB"], "bad size"),
    (["--collective", "allreduce"], "unknown collective"),
    (["--collective", "all_reduce", "--algorithm", "spiral"], "unknown algorithm"),
    (["--nproc", "0"], "--nproc"),
    (["--dtype", "complex64"], "--dtype"),
    (["--worlds", "2,9"], "--worlds"),
    (["--nproc", "1", "--calibrate"], "at least 2 ranks"),
    (["--ranks-per-node", "2", "--emulate-inter-node", "fast"], "--emulate-inter-node='fast' is not a number"),
    (["--ranks-per-node", "2", "--emulate-inter-node", "0"], "must be > 0"),
    (["--ranks-per-node", "2", "--emulate-inter-node", "1,-3"], "the latency must be µs >= 0"),
    (["--ranks-per-node", "2", "--emulate-inter-node", "1,2,3"], "give BW[,LATENCY_US]"),
    (["--emulate-inter-node", "1"], "--ranks-per-node below the largest world"),
    (["--nproc", "4", "--ranks-per-node", "4", "--emulate-inter-node", "1"], "largest world (4)"),
    (["--ranks-per-node", "2", "--emulate-inter-node", "1", "--compare"], "algorithm 'torch'"),
    (["--ranks-per-node", "2", "--emulate-inter-node", "1", "--calibrate"], "--calibrate"),
])
def test_bad_input_exits_2_before_any_rank_starts(argv, message, capsys):
    code, _, err = _main(["bench", "comm", *argv], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def _all_cells(group, cases):
    bad, unwritten = [], []
    for collective, algorithms, nbytes in cases:
        n = group.size()
        cell = Cell(collective, group, element_count(collective, nbytes, 4, n), torch.float32)
        bad += [(n, collective, a, nbytes, w) for a, w in zip(algorithms, check(cell, algorithms)) if w]
        cell.reset()  # and skip the call: the check must notice
        unwritten.append(cell.wrong())
    return bad, unwritten


def test_data_check_passes_for_every_collective_and_algorithm(pool):
    """The bench's reference results agree with every algorithm and with the backend ("torch")."""
    cases = [(c, registry.algorithms(c) + ("torch",), nbytes)
             for c in registry.COLLECTIVES for nbytes in (52, 4000)]
    for world in (1, 3, 4):
        results = pool.run(_all_cells, cases, world=world)
        assert [bad for bad, _ in results] == [[]] * world
        if world > 1:  # a call that wrote nothing is caught, on some rank, for every case
            assert all(sum(col) > 0 for col in zip(*(u for _, u in results)))


def test_cli_all_reduce_json(capsys):
    argv = ["bench", "comm", "--nproc", "2", "--collective", "all_reduce", "--sizes", "1KiB,64KiB",
            "--iters", "2", "--json"]
    code, out, _ = _main(argv, capsys)
    assert code == 0
    rows = json.loads(out)["rows"]
    algs = [a for a in registry.algorithms("all_reduce") if a not in NODE_AWARE]
    assert sorted((r["algorithm"], r["size"]) for r in rows) == sorted(
        (a, s) for a in algs for s in (1024, 65536))
    for r in rows:
        assert r["wrong"] == 0 and r["world"] == 2 and r["dtype"] == "float32"
        assert r["time_us"] > 0 and r["busbw"] == pytest.approx(r["algbw"])  # 2(n-1)/n = 1 on 2 ranks


def test_cli_calibrate_compare_plot(tmp_path, capsys):
    out_file, png = tmp_path / "cal.json", tmp_path / "busbw.png"
    argv = ["bench", "comm", "--nproc", "3", "--collective", "broadcast,all_gather", "--sizes", "1KiB,8KiB,64KiB",
            "--iters", "2", "--warmup", "0", "--compare", "--calibrate", "--out", str(out_file),
            "--plot", str(png)]
    code, out, err = _main(argv, capsys)
    if code == 1:      # a short sweep on a busy machine can fit worse than the defaults: refused, nothing written
        assert "calibration not written" in err and "worse than the built-in defaults" in err, err
        assert not out_file.exists()
        return
    assert code == 0, out
    assert "torch" in out and "calibration" in out and "fit error" in out
    data = json.loads(out_file.read_text())
    assert data["model"]["alpha"] >= 0 and data["error"]["rows"] > 0
    assert png.stat().st_size > 0


def test_cli_emulated_nodes_report_cross_node_bytes_and_prediction(capsys):
    """3 ranks on nodes {0, 1} and {2} (a sub-group of 4 ranks on 2 nodes): the measured cross-node bytes
    are the plan's, and every algorithm carries the α-β prediction of the emulated links."""
    argv = ["bench", "comm", "--nproc", "4", "--worlds", "3", "--ranks-per-node", "2", "--emulate-inter-node", "20,5",
            "--collective", "all_reduce", "--algorithm", "ring,hierarchical,tree", "--sizes", "12KiB",
            "--iters", "1", "--warmup", "0", "--json"]
    code, out, _ = _main(argv, capsys)
    assert code == 0
    rows = json.loads(out)["rows"]
    assert sorted(r["algorithm"] for r in rows) == ["hierarchical", "ring", "tree"]
    for r in rows:
        call = call_for("all_reduce", r["algorithm"], 3, r["count"], 4, ranks_per_node=2)
        if r["algorithm"] == "tree":
            assert r["cross_node_bytes"] == 3 * 4 * 1024  # 2 <-> 0, whole buffer
        assert r["cross_node_bytes"] == max(links.cross_node_bytes(call, k, [0, 1, 2], 2)[0] for k in range(3))
        assert r["emulated_us"] == pytest.approx(links.emulated_seconds(call, range(3), 2, 20.0, 5.0) * 1e6)
