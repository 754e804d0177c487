"""Non-finite gradients: an inf injected into one rank's gradient skips the step on every rank; fp16
backs its loss scale off, bf16 and fp32 count it and stop after `max_nonfinite` in a row with one
line naming the step and the rank it came from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ringzero import cli
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank

BASE = dict(model="nano", seq=16, micro_batch=2, eval_every=1000, eval_batches=1, max_bytes=1 << 15, steps=5)
QUICK = ["--seq", "16", "--micro-batch", "2", "--max-bytes", "32768", "--eval-batches", "1", "--steps", "5",
         "--quiet"]


def _train(group, cfg):
    return train_rank(cfg, group=group, keep_params=True, calibrate=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy, precision", [("dp", "fp32"), ("zero3", "bf16"), ("zero2", "fp16")])
def test_an_injected_inf_skips_the_step_on_every_rank(pool, strategy, precision):
    cfg = TrainConfig(strategy=strategy, precision=precision, inject_nonfinite=(1, 2), **BASE)
    res = pool.run(_train, cfg, world=2)
    for r in res:
        # fp16 may also overflow on its own in the first steps (its scale starts at 2^16), there in
        # the reduction's sum: no rank's own gradient is named then.
        assert (2, [1]) in r.nonfinite and r.skipped == len(r.nonfinite), (r.rank, r.skipped, r.nonfinite)
        assert r.skipped == 1 or precision == "fp16"
        assert r.params == res[0].params                      # the ranks agree after the skip
    if precision == "fp16":
        assert res[0].loss_scale == 2.0 ** 16 * 0.5 ** res[0].skipped       # backed off at each
    clean = pool.run(_train, TrainConfig(strategy=strategy, precision=precision, **BASE), world=2)
    assert res[0].losses[:3] == clean[0].losses[:3] and res[0].params != clean[0].params


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_parameter_server_skips_a_non_finite_push_and_names_its_worker(pool, mode):
    """Worker 1's push of step 2 holds an inf: sync, both servers skip that step's update (the
    global norm is summed over them); async, they skip that one push. The servers name worker 1."""
    ps = dict(BASE, strategy="ps", servers=2, ps_mode=mode)
    res = pool.run(_train, TrainConfig(inject_nonfinite=(1, 2), **ps), world=4)
    for server in res[2:]:
        assert server.ps["skipped"] == [(2, [1])], server.ps["skipped"]
    if mode == "sync":
        clean = pool.run(_train, TrainConfig(**ps), world=4)
        assert res[0].losses[:3] == clean[0].losses[:3] and res[0].params != clean[0].params


@pytest.mark.parametrize("layout", [[], ["--strategy", "ps", "--servers", "1"]])
def test_too_many_in_a_row_stop_the_run_naming_step_and_rank(capsys, layout):
    code = cli.main(["train", "--nproc", "2", *layout, "--inject-nonfinite", "1:2", "--max-nonfinite", "1", *QUICK])
    err = capsys.readouterr().err
    assert code == 1, err
    first = err.strip().splitlines()[0]
    assert "not finite" in first and "step 2" in first and "rank 1" in first, err


@pytest.mark.parametrize("argv, message", [
    (["--inject-nonfinite", "1"], "give RANK:STEP"),
    (["--inject-nonfinite", "2:1"], "rank 2 is not one of the 2 ranks"),
    (["--inject-nonfinite", "1:5"], "not one of the 5 steps"),
    (["--max-nonfinite", "0"], "max_nonfinite must be an integer >= 1"),
])
def test_bad_fault_options_are_one_line(argv, message, capsys):
    code = cli.main(["train", "--nproc", "2", *argv, *QUICK])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """The step-6 checkpoint of a run of `layout` never killed, made once per layout: the restart
    tests under the launcher and under torchrun compare against the same zero2 run."""
    made: dict[tuple, str] = {}

    def get(layout: list[str]) -> str:
        if tuple(layout) not in made:
            folder = tmp_path_factory.mktemp("unbroken")
            assert cli.main(["train", "--nproc", "2", *layout, "--save-every", "2", *QUICK, "--steps", "6",
                             "--quiet", "--save-dir", str(folder)]) == 0
            made[tuple(layout)] = str(folder / "step-00000006")
        return made[tuple(layout)]
    return get


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout, victim", [(["--strategy", "zero2"], 1),
                                            (["--strategy", "ps", "--servers", "1"], 2)])
def test_a_killed_rank_restarts_the_job_from_its_latest_checkpoint(tmp_path, capsys, unbroken, layout, victim):
    """--max-restarts 1: a rank is killed (SIGKILL) as step 3 begins (zero2: rank 1; the parameter
    server: its server, rank 2); the job restarts from the checkpoint of step 2 and ends with the
    parameters and Adam states of a run never killed."""
    from ringzero.checkpoint.load import Reader
    common = ["train", "--nproc", "2", *layout, "--save-every", "2", *QUICK, "--steps", "6"]
    assert cli.main([*common, "--save-dir", str(tmp_path / "b"), "--max-restarts", "1", "--inject-kill",
                     f"{victim}:3"]) == 0
    err = capsys.readouterr().err
    assert f"rank {victim}" in err and "restart 1 of 1 from" in err and "step-00000002" in err, err
    a, b = Reader(unbroken(layout)), Reader(str(tmp_path / "b" / "step-00000006"))
    assert a.manifest.tensors.keys() == b.manifest.tensors.keys()
    for name in a.manifest.tensors:
        assert a.tensor(name).equal(b.tensor(name)), name


@pytest.mark.timeout(300)
def test_torchruns_own_restart_resumes_from_the_newest_checkpoint(tmp_path, unbroken):
    """Under torchrun --max-restarts 1 the restarted ranks (TORCHELASTIC_RESTART_COUNT > 0) resume
    from the newest checkpoint under --save-dir and end as a run never killed, bit for bit."""
    from ringzero.checkpoint.load import Reader
    common = ["train", "--strategy", "zero2", "--save-every", "2", *QUICK, "--steps", "6", "--quiet"]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "--max-restarts", "1", "-m", "ringzero.cli", *common, "--save-dir", str(tmp_path / "b"),
                          "--inject-kill", "1:3"], capture_output=True, text=True, timeout=280,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "restarted by torchrun from" in out.stderr and "step-00000002" in out.stderr, out.stderr[-3000:]
    a, b = Reader(unbroken(["--strategy", "zero2"])), Reader(str(tmp_path / "b" / "step-00000006"))
    assert a.manifest.tensors.keys() == b.manifest.tensors.keys()
    for name in a.manifest.tensors:
        assert a.tensor(name).equal(b.tensor(name)), name
