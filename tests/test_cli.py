"""The command line's habits: --version, a fast top-level help that lists every command, choices in
`train --help`, exit codes (2 bad input, 1 runtime failure or bug, never a bug as bad input),
log lines when stdout is not a terminal, memory refused before ranks start, and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringzero import cli
from ringzero.commands import plan as plan_cmd
from ringzero.twin import footprint

QUICK = ["--seq", "16", "--micro-batch", "1", "--max-bytes", "65536"]


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_top_level_help_and_plan_never_import_torch():
    out = _python("import sys, contextlib, io\n"
                  "from ringzero import cli\n"
                  "with contextlib.redirect_stdout(io.StringIO()) as f:\n"
                  "    cli.main(['--help'])\n"
                  "    cli.main(['plan', '--model', 'gpt2', '--gpus', '8'])\n"
                  "print('torch' in sys.modules, 'train' in f.getvalue(), 'explain' in f.getvalue())")
    assert out.split() == ["False", "True", "True"]


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "ringzero 0.1.0"


def test_an_unknown_command_lists_every_command(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and all(f"'{c}'" in err for c in ("train", "plan", "bench", "explain")), err


def test_train_help_lists_the_choices_of_every_enumerated_flag(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for choices in ("{single,dp,zero1,zero2,zero3,ps}", "{fp32,bf16,fp16}", "{none,selective,full}",
                    "{eager,sdpa}", "{auto,torch,naive,ring,tree,butterfly,rabenseifner,hierarchical,hierarchical_2d}"):
        assert choices in out, choices
    assert "nano" in out and "micro" in out


def test_a_bug_is_an_internal_error_exit_1_not_bad_input(monkeypatch, capsys):
    def buggy(args):
        raise TypeError("unsupported operand on purpose")
    monkeypatch.setattr(plan_cmd, "run", buggy)
    assert cli.main(["plan", "--model", "gpt2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ringzero: internal error: TypeError") and "\n" not in err, err
    assert cli.main(["plan", "--model", "gpt2", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--timeout", "0"], "--timeout must be > 0"),
    (["--stall-timeout", "-1"], "--stall-timeout must be > 0"),
    (["--nproc", "100"], "GiB is available"),
    (["--seq", "100000", "--micro-batch", "8"], "activations"),
])
def test_bad_run_settings_are_refused_before_ranks_start(capsys, monkeypatch, argv, words):
    monkeypatch.setattr(footprint, "available_bytes", lambda: 8 * 2**30)     # whatever this machine has
    assert cli.main(["train", "--nproc", "2", "--steps", "1", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ringzero: error:") and "\n" not in err and words in err, err


def test_nproc_under_torchrun_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", "--nproc", "2", "--steps", "1", "--quiet"]) == 2
    assert "torchrun sets the world" in capsys.readouterr().err


def test_force_skips_the_memory_check(monkeypatch):
    from ringzero.commands import train as train_cmd
    monkeypatch.setattr(footprint, "available_bytes", lambda: 8 * 2**30)
    argv = ["train", "--nproc", "100", *QUICK]
    with pytest.raises(ValueError, match="GiB is available"):
        train_cmd.check(cli.build_parser("train").parse_args(argv), torchrun=False)
    job = train_cmd.check(cli.build_parser("train").parse_args([*argv, "--force"]), torchrun=False)
    assert job.world == 100


@pytest.mark.timeout(180)
def test_log_lines_when_stdout_is_not_a_terminal():
    out = subprocess.run([sys.executable, "-m", "ringzero.cli", "train", "--nproc", "1", "--steps", "4",
                          "--log-every", "2", *QUICK], capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["1/4", "2/4", "4/4"], out.stdout
    assert all("loss" in ln and "tokens/s" in ln for ln in lines)


@pytest.mark.timeout(240)
def test_torchrun_runs_and_rank_0_reports_every_rank(tmp_path):
    report = tmp_path / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "ringzero.cli", "train", "--strategy", "zero2", "--steps", "2", *QUICK,
                          "--json-report", str(report)],
                         capture_output=True, text=True, timeout=230, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("prediction beside the measurement") == 1, out.stdout     # rank 0's table only
    data = json.loads(report.read_text())
    assert data["world"] == 2
    assert sorted(r["rank"] for r in data["ranks"]) == [0, 1]


def _checks_on(cfg):
    from ringzero.comm.config import get_config
    return get_config().checks


def test_checks_flag_turns_the_handshake_on_in_the_ranks(monkeypatch):
    from ringzero.commands import train as train_cmd
    from ringzero.comm import config as comm_config
    from ringzero.train import rank
    seen = []
    monkeypatch.setattr(rank, "train_rank", lambda cfg, progress=None: seen.append(_checks_on(cfg)))
    prev = comm_config.set_config(comm_config.CommConfig(checks=False))
    try:
        train_cmd._rank_main(train_cmd.TrainConfig(steps=1), True, False, checks=True)
    finally:
        comm_config.set_config(prev)
    assert seen == [True]


def test_calibrating_only_the_backend_is_refused_before_measuring(capsys):
    argv = ["bench", "comm", "--nproc", "2", "--calibrate", "--algorithm", "torch", "--sizes", "4KiB,64KiB"]
    assert cli.main(argv) == 2
    assert "--calibrate fits ringzero's algorithms" in capsys.readouterr().err


def test_a_bad_checks_setting_is_bad_input(monkeypatch, capsys):
    monkeypatch.setenv("RINGZERO_CHECKS", "maybe")
    code = cli.main(["train", "--nproc", "2", "--steps", "1", "--quiet", *QUICK])
    err = capsys.readouterr().err
    assert code == 2 and "RINGZERO_CHECKS" in err, err
