"""`make gpu-check` (`ringzero.gpu_check`) on a machine without CUDA: it says so in one line, exits 0
and writes nothing; and every piece that needs no GPU, for real: the command lines it builds are
ones ringzero's own parsers accept, the runner keeps going past a failing part and stops a
timed-out part's whole process tree, the summary reads reports, and the NCCL comparison's rank
side runs on gloo ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ringzero import cli
from ringzero.gpu_check import __main__ as gpu_check
from ringzero.gpu_check import nccl_comm, parts, summary

HERE = os.path.dirname(os.path.abspath(__file__))


def test_without_cuda_it_says_so_in_one_line_exits_0_and_writes_nothing(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}      # no device, even on a GPU machine
    out = subprocess.run([sys.executable, "-m", "ringzero.gpu_check", "--out", str(tmp_path / "s.json")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and "no CUDA" in lines[0] and "nothing written" in lines[0], out.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, words", [
    (["--parts", "train,gpu"], ("--parts", "pytest, train, bench, nccl", "'train,gpu'")),
    (["--steps", "2"], ("--steps must be at least 4",)),
    (["--out", "missing/s.json"], ("--out", "does not exist")),
    (["--tests", "nowhere"], ("--tests", "not a folder")),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    code = gpu_check.main(["--out", "s.json", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("gpu-check: error:"), err
    assert all(w in err for w in words), err
    assert list(tmp_path.iterdir()) == []


def test_the_cuda_marker_is_registered_and_selects_the_gpu_tests():
    """--strict-markers refuses a marker pyproject.toml does not register; -m cuda selects by it."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--strict-markers", "--collect-only", "-q", "-m", "cuda",
                          "-p", "no:cacheprovider", os.path.join(HERE, "test_offload.py")],
                         capture_output=True, text=True, timeout=120, cwd=os.path.dirname(HERE))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    chosen = [ln for ln in out.stdout.splitlines() if "::" in ln]
    assert chosen and all("gpu" in ln for ln in chosen), out.stdout


@pytest.mark.parametrize("strategy, layout", [("dp", ("dp", 1, 1)), ("zero3", ("zero3", 1, 1)),
                                              ("tp", ("dp", 2, 1)), ("pp", ("dp", 1, 2))])
def test_each_training_run_is_a_valid_2_rank_torchrun_of_ringzero_train(tmp_path, monkeypatch, strategy, layout):
    from ringzero.commands import train as train_cmd
    report = str(tmp_path / "r.json")
    part = parts.train_part(strategy, 30, report)
    argv = list(part.argv)
    assert argv[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert argv[6:9] == ["-m", "ringzero.cli", "train"] and part.report == report
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    job = train_cmd.check(cli.build_parser("train").parse_args(argv[8:]), torchrun=True)
    assert job.world == 2 and job.cfg.training.steps == 30
    assert (job.cfg.parallel.strategy, job.cfg.parallel.tp, job.cfg.parallel.pp) == layout
    assert "--json-report" in argv and argv[argv.index("--json-report") + 1] == report
    assert not os.path.exists(report)


def test_the_bench_comm_run_compares_with_the_backends_own_collectives():
    from ringzero.bench import comm as bench_comm
    argv = list(parts.bench_comm_part().argv)
    assert argv[:3] == [sys.executable, "-m", "ringzero.cli"]
    args = cli.build_parser("bench").parse_args(argv[3:])
    job = bench_comm.build_job(args)
    assert args.json and job.worlds == (2,)
    assert [c for c, _ in job.cases] == ["all_reduce", "all_gather", "reduce_scatter"]
    assert all(algs[-1] == "torch" and len(algs) > 1 for _, algs in job.cases)


@pytest.mark.parametrize("devices, world", [(1, 1), (2, 2), (8, 2)])
def test_the_nccl_run_takes_two_ranks_or_the_one_device_there_is(tmp_path, devices, world):
    report = str(tmp_path / "n.json")
    part = parts.nccl_comm_part(devices, report)
    argv = list(part.argv)
    assert argv[argv.index("--nproc-per-node") + 1] == str(world)
    assert (part.note is None) == (world == 2)
    module = argv.index("ringzero.gpu_check.nccl_comm")
    assert nccl_comm.parse(argv[module + 1:]) == nccl_comm.Job(out=report)


def test_parts_run_in_order_past_a_failure_and_a_timeout_and_the_summary_says_so(tmp_path):
    report, pidfile, out = tmp_path / "r.json", tmp_path / "child.pid", str(tmp_path / "s.json")
    fake = {"config": {"strategy": "zero3", "tp": 1, "pp": 1, "steps": 4}, "world": 2,
            "val": [{"step": 4, "loss": 5.25}],
            "twins": {"step time": {"predicted": 2.0, "measured": 3.0, "unit": "s", "error": 0.5},
                      "bytes sent per step": {"predicted": 8, "measured": 8, "unit": "bytes", "error": 0.0}}}
    writes = f"import json; json.dump({fake!r}, open({str(report)!r}, 'w')); print('NCCL INFO Init COMPLETE')"
    hangs = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
             f"time.sleep(120)']); open({str(pidfile)!r}, 'w').write(str(p.pid)); print('waiting', flush=True); "
             "time.sleep(120)")
    py = sys.executable
    plan = [parts.Part("fails", "train", (py, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"),
                       30, report=str(tmp_path / "none.json")),
            parts.Part("hangs", "pytest", (py, "-c", hangs), 3),
            parts.Part("trains", "train", (py, "-c", writes), 30, report=str(report))]
    said = []
    final = gpu_check.run_parts(plan, out, {"devices": 0}, say=said.append)
    assert [e["name"] for e in final["parts"]] == ["fails", "hangs", "trains"]
    assert [e["status"] for e in final["parts"]] == ["failed", "timeout", "passed"]
    failed, hung, trained = final["parts"]
    assert failed["rc"] == 3 and "boom" in failed["tail"] and "no report at" in failed["numbers_error"]
    assert hung["rc"] is None and "waiting" in hung["tail"]
    assert _gone(int(pidfile.read_text())), "the timed-out part's child was left running"
    assert trained["nccl_log_lines"] == 1 and "tail" not in trained
    assert trained["numbers"]["twins"]["step time"]["error"] == 0.5
    assert trained["numbers"]["worst_twin"] == {"name": "step time", "error": 0.5}
    assert trained["numbers"]["val_loss"] == 5.25 and trained["numbers"]["world"] == 2
    assert final["counts"] == {"passed": 1, "failed": 1, "timeout": 1} and not final["ok"] and final["complete"]
    assert json.loads(open(out).read()) == final
    assert [s.split(":")[1].strip() for s in said] == ["fails", "hangs", "trains"]


def _gone(pid: int) -> bool:
    """The process has exited (gone, or a zombie its new parent has not reaped yet)."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _finished(stdout: str = "", rc: int = 0) -> parts.Finished:
    return parts.Finished(rc, stdout, "", 1.0, False)


def test_pytest_passes_only_when_a_cuda_test_ran():
    part = parts.pytest_part(HERE)
    ran = summary.entry(part, _finished("..\n2 passed, 1 deselected in 3.10s\n"))
    assert ran["status"] == "passed" and ran["numbers"] == {"passed": 2, "deselected": 1}
    skipped = summary.entry(part, _finished("ss\n2 skipped in 0.10s\n"))
    assert skipped["status"] == "failed" and "no CUDA test passed" in skipped["numbers_error"]
    assert "2 skipped" in skipped["tail"]


def test_comm_rows_are_timed_against_the_backends_own_collective():
    rows = [{"collective": "all_reduce", "algorithm": a, "world": 2, "size": 1024, "time_us": t, "busbw": 1.0,
             "wrong": 0} for a, t in (("ring", 300.0), ("torch", 150.0), ("tree", 75.0))]
    rows.append({**rows[0], "size": 4096, "time_us": 10.0})       # no peer row at this size
    got = summary.bench_comm_numbers(_finished(json.dumps({"nproc": 2, "rows": rows})), parts.bench_comm_part())
    assert [r["vs_peer"] for r in got["rows"]] == [2.0, 1.0, 0.5, None] and got["wrong"] == 0


def test_an_nccl_report_cut_short_fails_the_part_with_its_rows_counted(tmp_path):
    report = tmp_path / "n.json"
    row = {"collective": "all_reduce", "algorithm": "ring", "world": 2, "size": 1024, "time_us": 5.0,
           "wrong": 0, "error": None}
    report.write_text(json.dumps({"backend": "nccl", "device": "cuda:0", "world": 2, "complete": False,
                                  "rows": [row], "checks": None}))
    e = summary.entry(parts.nccl_comm_part(2, str(report)), parts.Finished(None, "", "killed", 120.0, True))
    assert e["status"] == "timeout" and "stops after 1 rows" in e["numbers_error"] and "killed" in e["tail"]


def test_an_algorithm_that_raises_is_a_row_with_its_error_not_the_end_of_the_run():
    class Raises:
        def reset(self):
            pass

        def call(self, algorithm):
            raise RuntimeError("No backend type associated with device type cpu\nmore detail")

    reps, wrong, err = nccl_comm._time(Raises(), "ring", nccl_comm.Job(iters=3), nccl_comm.torch.device("cpu"))
    assert reps == [nccl_comm.FAILED] * 3 and wrong == 0
    assert err == "RuntimeError: No backend type associated with device type cpu"


def test_the_nccl_comparison_runs_on_gloo_ranks_checks_every_algorithm_and_writes_its_report(pool, tmp_path):
    out = tmp_path / "n.json"
    job = nccl_comm.Job(collectives=("all_reduce", "all_gather"), sizes=(1024,), iters=1, inner=1, out=str(out))
    report = pool.run(nccl_comm.measure, job, world=2)[0]
    assert report["backend"] == "gloo" and report["world"] == 2 and report["complete"]
    from ringzero.comm import registry
    from ringzero.plan.comm.algorithms import spans_nodes_ok
    for c in job.collectives:                 # the node-aware ones only where a group spans nodes
        want = [a for a in registry.algorithms(c) if spans_nodes_ok(a, 2, None)]
        assert len(want) > 1 and [r["algorithm"] for r in report["rows"] if r["collective"] == c] == [*want, "torch"]
    assert all(r["error"] is None and r["wrong"] == 0 and r["time_us"] > 0 for r in report["rows"])
    assert report["checks"] == {"ok": True, "error": None}
    assert json.loads(out.read_text()) == report
