"""The same rule everywhere, and clear messages: bench comm's limits and nodes as `train`'s, memory
before the ranks, the parameter servers' rule in `plan` and `train`, injected faults inside the run,
one rule for figure files, values that look like flags, deep JSON, the collectives on tensors that
require grad or live on `meta`, Ctrl-C without ranks, and a launcher killed with SIGKILL.

Refusals follow tests/test_bad_input.py: exit code 2, one line, nothing written, no rank started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ringzero import cli, comm
from cli_errors import alive, forbid_ranks, refused

GIB = 2**30


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    forbid_ranks(monkeypatch)
    return tmp_path


def passed_the_checks(capsys, argv: list[str]) -> None:
    """cli.main(argv) got as far as starting ranks (which `cwd` makes fail)."""
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 1 and "a rank was about to start" in err, (code, err)


# 1, 2: bench comm's timeout and nodes, refused as train refuses them

def test_bench_comm_refuses_a_timeout_that_is_not_positive(cwd, capsys):
    for t in ("0", "-5"):
        refused(capsys, cwd, ["bench", "comm", "--timeout", t], "--timeout must be > 0 seconds", t)


def test_bench_comm_refuses_nodes_that_do_not_divide_the_ranks_as_train_does(cwd, capsys):
    bench = refused(capsys, cwd, ["bench", "comm", "--nproc", "4", "--ranks-per-node", "3"], "does not divide")
    train = refused(capsys, cwd, ["train", "--nproc", "4", "--ranks-per-node", "3", "--quiet"])
    assert bench == train == "ranks_per_node=3 does not divide the 4 ranks; nodes hold equal numbers of ranks"


# 3: the buffers' memory, before the ranks

@pytest.fixture
def eight_gib(monkeypatch):
    monkeypatch.setattr("ringzero.bench.comm_memory.available_bytes", lambda: 8 * GIB)


def test_bench_comm_refuses_sizes_beyond_the_memory_available(cwd, capsys, eight_gib):
    line = refused(capsys, cwd, ["bench", "comm", "--nproc", "2", "--collective", "all_reduce", "--sizes", "1KiB,100GiB"],
                   "2 ranks need about", "100 GiB", "8.0 GiB is available", "--force")
    from ringzero.bench.comm_memory import factor, rank_bytes
    per_byte = factor([("all_reduce", ("auto",))], [2])
    assert f"{2 * rank_bytes(100 * GIB, per_byte) / GIB:.1f} GiB" in line


def test_bench_comm_force_skips_the_memory_check_only(cwd, capsys, eight_gib):
    passed_the_checks(capsys, ["bench", "comm", "--nproc", "2", "--collective", "all_reduce", "--sizes", "100GiB",
                               "--force"])


def test_bench_comm_memory_grows_with_the_ranks_and_the_largest_size():
    from ringzero.bench import comm_memory
    ring = [("all_reduce", ("ring",))]
    assert comm_memory.check((GIB, 4096), 4, ring, [4], force=True) == 4 * comm_memory.rank_bytes(GIB, 3.25)
    assert comm_memory.rank_bytes(2 * GIB, 3.25) - comm_memory.rank_bytes(GIB, 3.25) == 3.25 * GIB


# 4: parameter servers: one rule for plan and train

def test_plan_refuses_as_many_servers_as_workers_like_train(cwd, capsys):
    plan = refused(capsys, cwd, ["plan", "--model", "gpt2", "--gpus", "2", "--servers", "4"],
                   "--servers=4 must be fewer than the 2 workers (the dp ranks)")
    refused(capsys, cwd, ["plan", "--model", "gpt2", "--gpus", "2", "--servers", "2"], "fewer than the 2 workers")
    train = refused(capsys, cwd, ["train", "--strategy", "ps", "--nproc", "2", "--servers", "4", "--quiet"])
    tail = "a server per worker or more leaves servers idle"
    assert plan.endswith(tail) and train.endswith(tail), (plan, train)


def test_plan_still_plans_fewer_servers_than_workers(capsys):
    assert cli.main(["plan", "--model", "gpt2", "--gpus", "8", "--servers", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameter_server"]["servers"] == 2


# 5: injected faults: a rank that takes steps, a step the run takes

def test_an_inf_in_a_server_s_gradient_is_refused_and_a_server_s_death_is_not(cwd, capsys):
    # --nproc 2 --servers 1: ranks 0-1 are workers, rank 2 a server, which computes no gradient
    ps = ["train", "--strategy", "ps", "--nproc", "2", "--servers", "1", "--quiet"]
    refused(capsys, cwd, [*ps, "--inject-nonfinite", "2:0"],
            "--inject-nonfinite rank 2 is not one of the 2 ranks that compute gradients", "allowed: 0-1")
    refused(capsys, cwd, [*ps, "--inject-kill", "3:0"], "--inject-kill rank 3 is not one of the 3 ranks; allowed: 0-2")
    passed_the_checks(capsys, [*ps, "--inject-kill", "2:0"])


def _checkpoint_at(root, step: int) -> str:
    """A checkpoint folder of the default model at `step` (a manifest; no tensors are read first)."""
    folder = root / "ck" / f"step-{step:08d}"
    folder.mkdir(parents=True)
    manifest = {"format": "ringzero.checkpoint/1", "step": step, "layout": {}, "tensors": {},
                "config": {"model": "nano", "layers": None, "seq": None}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(root / "ck")


@pytest.mark.parametrize("flag", ["--inject-nonfinite", "--inject-kill"])
def test_a_fault_before_the_resumed_step_is_refused_with_the_range(cwd, capsys, flag):
    ck = _checkpoint_at(cwd, 5)
    refused(capsys, cwd, ["train", "--resume", ck, "--steps", "10", flag, "0:2", "--quiet"],
            f"{flag} step 2 is not one this run takes (it resumes from the checkpoint of step 5)",
            "allowed: 5-9 (steps count from 0)")


# 6: figures: whatever matplotlib writes, on every command; the same refusal otherwise

def test_plan_writes_an_svg(tmp_path, capsys):
    path = tmp_path / "memory.svg"
    assert cli.main(["plan", "--model", "gpt2", "--plot", str(path)]) == 0, capsys.readouterr().err
    assert b"<svg" in path.read_bytes()[:1000]


def test_every_figure_flag_refuses_a_suffix_matplotlib_cannot_write_with_the_same_list(cwd, capsys):
    plan = refused(capsys, cwd, ["plan", "--model", "gpt2", "--plot", "x.txt"], "--plot 'x.txt'")
    train = refused(capsys, cwd, ["train", "--nproc", "2", "--pp", "2", "--pipeline-plot", "x.txt", "--quiet"],
                    "--pipeline-plot 'x.txt'")
    bench = refused(capsys, cwd, ["bench", "comm", "--sizes", "4KiB", "--plot", "x.txt"], "--plot 'x.txt'")
    refused(capsys, cwd, ["plan", "--model", "gpt2", "--plot", "noformat"], "has no suffix")
    allowed = plan.split("allowed: ")[1]
    assert train.split("allowed: ")[1] == bench.split("allowed: ")[1] == allowed
    assert allowed.startswith(".png, ") and all(f in allowed.split(", ") for f in (".svg", ".pdf"))


def test_train_accepts_an_svg_pipeline_plot(cwd, capsys):
    passed_the_checks(capsys, ["train", "--nproc", "2", "--pp", "2", "--pipeline-plot", "schedule.svg", "--quiet"])


# 7: values that look like flags reach the check that names the field

@pytest.mark.parametrize("argv, expected", [
    (["train", "--straggler", "-1:2"], "straggler must be (rank >= 0, factor >= 1), got (-1, 2.0)"),
    (["train", "--pipeline-cost", "-1,5"], "--pipeline-cost '-1,5': give forward and backward milliseconds >= 0"),
    (["train", "--inject-nonfinite", "-1:2"], "inject_nonfinite must be (rank >= 0, step >= 0)"),
    (["train", "--inject-kill", "-1:0"], "inject_kill must be (rank >= 0, step >= 0)"),
    (["train", "--emulate-inter-node", "-1,5"], "--emulate-inter-node must be > 0, got '-1'"),
    (["bench", "comm", "--emulate-inter-node", "-1,5"], "--emulate-inter-node must be > 0, got '-1'"),
    (["bench", "comm", "--worlds", "-2,4"], "--worlds must lie in 1..--nproc (4), got -2"),
    (["bench", "ps", "--staleness", "-1,2"], "staleness must be an integer >= 0"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_value_like_a_flag_reaches_its_check(cwd, capsys, argv, expected):
    refused(capsys, cwd, argv + (["--quiet"] if argv[0] == "train" else []), expected)


def _value_options(command: str, bench: str | None = None):
    parser = cli.build_parser(command)
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    if bench:
        sub = next(a for a in sub._actions if a.dest == "bench_command").choices[bench]
    return [a.option_strings[-1] for a in sub._actions if a.option_strings and a.nargs is None], sub


@pytest.mark.parametrize("command, bench", [("train", None), ("plan", None), ("bench", "comm"), ("bench", "train"),
                                            ("bench", "ps"), ("explain", None)])
def test_no_option_answers_expected_one_argument_to_a_negative_looking_value(capsys, command, bench):
    options, sub = _value_options(command, bench)
    assert options
    for opt in options:
        for value in ("-1:2", "-1,5", "-4KiB"):
            with pytest.raises(SystemExit):
                sub.parse_args([opt, value, "--no-such-flag-here"])
            err = capsys.readouterr().err
            assert "expected one argument" not in err, (opt, value, err)


# 8: a JSON config nested too deeply

@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000],
                         ids=["lists", "objects"])
def test_a_deeply_nested_config_is_one_line_naming_the_file(cwd, capsys, text):
    (cwd / "deep.json").write_text(text)
    refused(capsys, cwd, ["train", "--config", "deep.json", "--quiet"],
            "config file 'deep.json' nests lists or objects too deeply")


# 9: the collectives on a tensor that requires grad, and on meta

ALGORITHMS = ("naive", "auto", "torch")      # each collective has naive; auto picks one of its own


def _on_parameters(group):
    r, out = torch.distributed.get_rank(group), []
    for a in ALGORITHMS:
        t = torch.full((6,), float(r + 1), requires_grad=True)
        comm.all_reduce(t, group=group, algorithm=a)
        b = torch.full((6,), float(r), requires_grad=True)
        comm.broadcast(b, 0, group=group, algorithm=a)
        g = torch.empty(12, requires_grad=True)
        comm.all_gather_into_tensor(g, torch.full((6,), float(r), requires_grad=True), group=group, algorithm=a)
        s = torch.empty(3, requires_grad=True)
        comm.reduce_scatter_tensor(s, torch.ones(6, requires_grad=True), group=group, algorithm=a)
        out.append((t.tolist(), t.requires_grad and t.grad_fn is None, b.tolist(), g.tolist(), s.tolist()))
    return out


@pytest.mark.timeout(180)
def test_collectives_work_on_tensors_that_require_grad_as_torch_distributed_does(pool):
    for rank, results in enumerate(pool.run(_on_parameters, world=2)):
        for a, (t, leaf, b, g, s) in zip(ALGORITHMS, results):
            assert t == [3.0] * 6 and leaf, (a, rank)
            assert b == [0.0] * 6 and g == [0.0] * 6 + [1.0] * 6 and s == [2.0] * 3, (a, rank)


def _on_meta(group):
    errors = []
    for call in (lambda: comm.all_reduce(torch.empty(4, device="meta"), group=group, algorithm="ring"),
                 lambda: comm.all_gather_into_tensor(torch.empty(8, device="meta"), torch.empty(4), group=group),
                 lambda: comm.all_to_all([torch.empty(2) for _ in range(2)],
                                         [torch.empty(2, device="meta") for _ in range(2)], group=group)):
        try:
            call()
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    return errors


@pytest.mark.timeout(180)
def test_a_meta_tensor_is_refused_naming_the_device(pool):
    for errors in pool.run(_on_meta, world=2):
        for collective, e in zip(("all_reduce", "all_gather", "all_to_all"), errors):
            assert e is not None and e.startswith(f"{collective}: a tensor is on device 'meta'"), e
            assert "allowed:" in e and "\n" not in e


# 10: Ctrl-C on a command without ranks

def test_ctrl_c_on_plan_does_not_speak_of_ranks(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("ringzero.commands.plan.estimate", interrupted)
    assert cli.main(["plan", "--model", "gpt2"]) == 128 + signal.SIGINT
    assert capsys.readouterr().err.strip() == "ringzero: interrupted (Ctrl-C)"


def test_ctrl_c_on_a_command_with_ranks_says_they_were_stopped(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("ringzero.launch.spawn", interrupted)
    assert cli.main(["bench", "comm", "--nproc", "2", "--collective", "all_reduce", "--sizes", "4KiB"]) == 130
    assert capsys.readouterr().err.strip() == "ringzero: interrupted (Ctrl-C); every rank was stopped"


# 11: the launcher killed with SIGKILL: its ranks follow it, and nothing is said about semaphores

def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if d.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out


def test_sigkill_of_the_launcher_leaves_no_rank_and_no_leaked_semaphore(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "ringzero.cli", "train", "--nproc", "2", "--steps", "1000"],
                         stdout=subprocess.PIPE, stderr=open(tmp_path / "err", "wb"), cwd=tmp_path,
                         start_new_session=True)
    try:
        while b"step 1/1000" not in (line := p.stdout.readline()):
            assert line, "the run ended before its first step: " + (tmp_path / "err").read_text()
        kids = _children(p.pid)
        assert len(kids) >= 2, kids                     # the ranks (and multiprocessing's resource tracker)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 120
        while any(alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [k for k in kids if alive(k)], "orphaned ranks"
        time.sleep(1.0)                                 # the tracker's last word, if any, is written by now
        err = (tmp_path / "err").read_text()
        assert "leaked semaphore" not in err and "resource_tracker" not in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_deeply_nested_calibration_file_names_the_file(tmp_path):
    from ringzero.comm import cost
    path = tmp_path / "calibration.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="calibration file .*calibration.json is not valid"):
        cost.load(path)
