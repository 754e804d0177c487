"""The parameter server on real ranks: sync equals all-reduce data parallelism, SSP keeps its
staleness bound under a straggler, async runs ahead of a stalled worker, the byte and waiting twins,
a dying rank ends the job naming it, and bad input is one line before any rank starts."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from ringzero import cli, launch
from ringzero.parallel.ps import client as ps_client
from ringzero.parallel.ps import server as ps_server
from ringzero.plan.strategies.param_server import comm_seconds
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank
from ringzero.twin.ps import twins, waits

from cli_errors import train_fails

BASE = dict(model="nano", seq=32, micro_batch=2, eval_every=1000, eval_batches=1, max_bytes=1 << 16)
QUICK = ["--seq", "16", "--micro-batch", "1", "--max-bytes", "65536", "--steps", "2"]


def _train(group, cfg, keep=True):
    return train_rank(cfg, group=group, keep_params=keep)


def _max_abs(a: dict, b: dict) -> float:
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers,servers", [(2, 1), (3, 2)])
def test_sync_equals_all_reduce_data_parallelism(pool, workers, servers):
    """Same seed and data: the losses and every parameter equal DP's within rounding (the server
    sums the pushes in worker order, the ring in its own); two servers split the global norm."""
    dp = pool.run(_train, TrainConfig(strategy="dp", steps=3, **BASE), world=workers)
    ps = pool.run(_train, TrainConfig(strategy="ps", servers=servers, steps=3, **BASE), world=workers + servers)
    assert [r.role for r in ps] == ["worker"] * workers + ["server"] * servers
    assert ps[0].losses == pytest.approx(dp[0].losses, rel=1e-6)
    for w in ps[:workers]:
        assert _max_abs(dp[0].params, w.params) < 1e-5
    for s in ps[workers:]:
        assert s.ps["staleness"] == [0] * 3 and s.ps["updates"] == 3 and s.ps["pushes"] == 3 * workers
    cfg = TrainConfig(strategy="ps", servers=servers, steps=3, **BASE)
    for row in twins(cfg, workers + servers, ps):        # push, pull, the busiest server's ingress
        assert row.measured == row.predicted, row


@pytest.mark.timeout(300)
@pytest.mark.parametrize("s", [1, 2])
def test_ssp_staleness_never_exceeds_its_bound_under_a_straggler(pool, s):
    """Worker 1 computes 4x as long: worker 0 runs ahead until the gate holds it S steps ahead."""
    cfg = TrainConfig(strategy="ps", servers=1, ps_mode="ssp", staleness=s, straggler=(1, 4.0), steps=8, **BASE)
    ps = pool.run(_train, cfg, False, world=3)
    server = ps[2].ps
    assert server["updates"] == 16
    # the straggler drove the fast worker to the gate, and no further
    assert max(server["staleness"]) == s and server["max_lead"] == s, (server["staleness"], server["max_lead"])
    assert all(x == x for x in ps[0].losses)


@pytest.mark.timeout(300)
def test_async_runs_ahead_of_a_stalled_worker(pool):
    """Async: worker 0 finishes while worker 1, 20x slower, is still early in its steps; every
    update records its staleness, and the run still lowers the loss."""
    cfg = TrainConfig(strategy="ps", servers=1, ps_mode="async", straggler=(1, 20.0), steps=6, **BASE)
    ps = pool.run(_train, cfg, False, world=3)
    server = ps[2].ps
    assert server["max_lead"] >= 4 and server["updates"] == 12
    assert len(server["staleness"]) == 12 and max(server["staleness"]) >= 4     # the fast one's
    assert ps[0].losses[-1] < ps[0].losses[0]


@pytest.mark.timeout(300)
def test_waiting_for_a_straggler_is_predicted(pool):
    """Sync with worker 1 computing 6x as long: worker 0 waits for it, as plan.param_server says
    (the slowest's compute minus its own), within 15 %; the straggler itself waits for nobody.
    The model leaves out that the server answers worker 0 first, so the straggler starts one reply
    later (~2-3 ms on a quiet machine, 8 ms with three ranks on two busy cores): micro-batches of 8
    and a 6x straggler make the imbalance (~130 ms) large beside it. At 3x (~50 ms) a full suite
    run measured +16 %."""
    cfg = TrainConfig(strategy="ps", servers=1, straggler=(1, 6.0), steps=8,
                      **{**BASE, "micro_batch": 8})
    ps = pool.run(_train, cfg, False, world=3)
    predicted, measured = waits(ps[:2])
    assert predicted[1] == 0.0 and measured[1] < 1e-3     # the straggler's push is the step's last
    assert measured[0] == pytest.approx(predicted[0], rel=0.15), (predicted, measured)


def _train_dying(cfg, who):
    """Rank `who` fails mid-run: a worker raises in its third push, a server exits on its third."""
    if dist.get_rank() == who and who < 2:
        real_push = ps_client.PSClient.push_pull

        def push_pull(self, grads, step):
            if step == 2:
                raise RuntimeError("worker failure on purpose")
            return real_push(self, grads, step)
        ps_client.PSClient.push_pull = push_pull
    elif dist.get_rank() == who:
        real = ps_server.ParameterServer._push

        def push(self, *args):
            if self.log.pushes == 2:
                os._exit(3)
            return real(self, *args)
        ps_server.ParameterServer._push = push
    return train_rank(cfg)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("who", [1, 2])
def test_a_dying_worker_or_server_ends_every_rank_naming_it(who):
    """Nobody waits on a dead peer: the launcher stops the others and names the rank (well within 60 s)."""
    cfg = TrainConfig(strategy="ps", servers=1, steps=6, **BASE)
    with pytest.raises(launch.RankError) as err:
        launch.spawn(_train_dying, 3, (cfg, who), timeout=60)
    assert err.value.rank == who and "timed out" not in err.value.summary, err.value.summary


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv,words", [
    (["--nproc", "2", "--strategy", "ps", "--servers", "2"], ("servers=2", "fewer than the 2 workers")),
    (["--nproc", "2", "--strategy", "ps"], ("servers >= 1",)),
    (["--nproc", "3", "--strategy", "ps", "--servers", "1", "--ps-mode", "ssp", "--staleness", "-1"], ("staleness",)),
    (["--nproc", "2", "--ps-mode", "async"], ("ps_mode", "strategy 'ps'")),
    (["--nproc", "2", "--straggler", "2:2"], ("straggler rank 2", "0-1")),
    (["--nproc", "2", "--straggler", "1:0.5"], ("straggler", "factor >= 1")),
    (["--nproc", "2", "--straggler", "fast"], ("RANK:FACTOR",)),
    (["--nproc", "3", "--strategy", "ps", "--servers", "1", "--tp", "3"], ("tp=3",)),
])
def test_bad_input_is_one_line_before_any_rank_starts(capsys, tmp_path, argv, words):
    train_fails(capsys, tmp_path, [*argv, *QUICK], *words)


@pytest.mark.timeout(300)
def test_train_command_prints_the_ranks_table_and_writes_the_twins(capsys, tmp_path):
    out = tmp_path / "ps.json"
    code = cli.main(["train", "--nproc", "2", "--strategy", "ps", "--servers", "1", "--ps-mode", "ssp",
                     "--staleness", "1", "--straggler", "1:2", *QUICK, "--steps", "4", "--json-report", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "parameter server, ssp S=1" in text and "staleness" in text
    import json
    data = json.loads(out.read_text())
    assert {r["role"] for r in data["ranks"]} == {"worker", "server"}
    for name in ("push bytes per worker per step", "pull bytes per worker per step"):
        assert data["twins"][name]["error"] == 0.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv,words", [
    (["--nproc", "1"], ("--nproc", ">= 2")),
    (["--nproc", "2", "--servers", "2"], ("servers=2",)),
    (["--nproc", "2", "--straggler", "0.5"], ("straggler", "factor >= 1")),
    (["--nproc", "2", "--staleness", "-1"], ("staleness",)),
])
def test_bench_ps_bad_input_is_one_line(capsys, tmp_path, argv, words):
    plot = tmp_path / "ps.png"
    code = cli.main(["bench", "ps", *argv, "--plot", str(plot)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("ringzero: error:") and "\n" not in err, err
    assert all(w in err for w in words), err
    assert not plot.exists()


def test_bench_ps_time_to_target():
    from ringzero.bench.ps import reached
    row = {"val": [(5, 3.1, 1.0), (10, 2.9, 2.0), (15, 2.95, 3.0), (20, 2.8, 4.0)]}
    assert reached(row, 2.9) == 2.0 and reached(row, 2.85) == 4.0 and reached(row, 2.0) is None


@pytest.mark.timeout(300)
def test_the_step_over_an_emulated_link_is_predicted(pool):
    """Sync, 2 workers and 1 server, every rank its own node on a 0.01 GB/s link: the step is the
    slowest compute, the server's two pulls one after the other, the last push, and the update
    (`plan.strategies.param_server.comm_seconds` "staggered"), within 15 %; the link time dominates it."""
    cfg = TrainConfig(strategy="ps", servers=1, steps=6, ranks_per_node=1, emulate_inter_node=(0.01, 5.0), **BASE)
    ps = pool.run(_train, cfg, False, world=3)
    (row,) = [t for t in twins(cfg, 3, ps) if t.name.startswith("step over")]
    numel = sum(n for n, *_ in ps[0].buckets)
    link = comm_seconds(numel, 4, 2, 1, 0.01e9, 5e-6, schedule="staggered")
    assert link == pytest.approx(3 * numel * 4 / 0.01e9, rel=1e-3) and row.predicted > link > row.predicted / 2
    assert row.measured == pytest.approx(row.predicted, rel=0.15), (row.predicted, row.measured)
