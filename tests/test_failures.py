"""Failure handling of the launcher and the command line: nothing hangs, nothing is orphaned, and
each failure is one line naming the rank.

- a frozen rank (SIGSTOP) and a deadlock stop the job through the progress watchdog and name the
  rank(s) that did not complete the step;
- SIGTERM and SIGINT to `ringzero train` stop every rank and end with one line, no traceback;
- a killed parent (SIGKILL: no handler runs) takes its ranks with it;
- a rank's runtime failure is one line with the rank's last stderr lines, exit 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from ringzero import comm, launch, watchdog
from cli_errors import alive
from ringzero.watchdog import WatchdogPolicy, beacon

QUICK = ["--seq", "16", "--micro-batch", "1", "--max-bytes", "65536", "--eval-every", "1000"]
FAST_WATCH = WatchdogPolicy(floor_s=5.0, factor=20.0)


def _steps(freeze_rank: int | None, freeze_at: int, how: str, steps: int = 50):
    """Barrier-synchronised "steps"; rank `freeze_rank` freezes before step `freeze_at`."""
    rank = dist.get_rank()
    for k in range(steps):
        if rank == freeze_rank and k == freeze_at:
            if how == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                time.sleep(3600)                     # alive (heartbeat ticks) but never arrives
        comm.all_reduce(torch.ones(1), algorithm="ring")     # a recorded collective (comm.flight)
        beacon().step_done(k + 1)
        time.sleep(0.05)
    beacon().finished()
    return rank


@pytest.mark.timeout(120)
def test_a_stopped_rank_is_named_by_the_watchdog():
    with pytest.raises(launch.RankError) as err:
        launch.spawn(_steps, 3, (1, 4, "sigstop"), timeout=100, watch=FAST_WATCH)
    msg = err.value.summary
    assert "no progress" in msg and "[1] are frozen" in msg, msg     # the watchdog, not the timeout
    assert "did not complete step 5" in msg and err.value.rank == 1, msg


@pytest.mark.timeout(120)
def test_a_deadlock_is_stopped_and_says_every_rank_is_alive():
    with pytest.raises(launch.RankError) as err:
        launch.spawn(_steps, 2, (1, 3, "sleep"), timeout=100, watch=FAST_WATCH)
    msg = err.value.summary
    assert "ranks [0, 1] did not complete step 4" in msg and "all are alive" in msg, msg
    # The flight recorders say where: rank 0 waits in the 4th all-reduce, which rank 1 never began.
    assert "all_reduce #3 (" in msg and "4 bytes) on ranks [0, 1]: ranks [0] waited in it, rank 1 (its last " \
           "there: #2) never arrived" in msg, msg
    dump = json.loads(open(msg.rsplit(": ", 1)[1]).read())      # torch's dump layout, one per rank
    entries = dump["0"]["entries"]
    assert [c["collective_seq_id"] for c in entries][-2:] == [2, 3] and entries[-1]["state"] == "started"
    assert dump["1"]["pg_status"]["0"]["last_started_collective"] == 2


TORCHRUN_HANG = """
import time, torch, torch.distributed as dist
from ringzero import comm, launch
from ringzero.watchdog import WatchdogPolicy

def job():
    dist.barrier()        # torch's, unwatched: a rank started seconds late under load is not the stall
    for k in range(50):
        if dist.get_rank() == 1 and k == 3:
            time.sleep(3600)                     # alive, never arrives
        comm.all_reduce(torch.ones(1), algorithm="ring")

launch.run(job, watch=WatchdogPolicy(floor_s=3.0), backend="gloo")
"""


@pytest.mark.timeout(150)
def test_under_torchrun_a_hung_collective_ends_the_job_naming_who_never_arrived(tmp_path):
    """No ringzero launcher watches a torchrun job: the waiting rank's own flight thread keeps the
    deadline, names the collective and the rank that never arrived, and exits 1."""
    script = tmp_path / "hang.py"
    script.write_text(TORCHRUN_HANG)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, timeout=140,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode != 0
    assert "ringzero: rank 0: a collective did not complete in 3 s (--stall-timeout): all_reduce #3 (" in out.stderr, \
        out.stderr[:4000]
    assert "rank 1 (its last there: #2) never arrived" in out.stderr, out.stderr[:4000]


@pytest.mark.timeout(120)
def test_a_hang_in_the_first_step_is_caught_too():
    with pytest.raises(launch.RankError) as err:
        launch.spawn(_steps, 2, (0, 0, "sleep"), timeout=100, watch=FAST_WATCH)
    assert "did not complete step 1" in err.value.summary, err.value.summary


class _FakeProc:
    pid = None


def test_the_bound_follows_slow_steps(monkeypatch):
    """Steps slower than the floor never trip the watchdog; a stall of factor x the slowest does."""
    clock = [1000.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])

    class Ctx:
        @staticmethod
        def Array(kind, size, lock):
            return [0.0] * size
    dog = watchdog.Watchdog(Ctx, 1, WatchdogPolicy(floor_s=1.0, factor=3.0))
    dog.array[1] = clock[0]                     # rank 0 has started (its heartbeat)

    def at(t: float, steps: int):
        clock[0] = 1000.0 + t
        dog.array[0], dog.array[1] = steps, clock[0]
        return dog.check([_FakeProc()], [0])
    assert at(0.0, 0) is None                   # every rank started
    assert at(0.9, 1) is None                   # the first step: within the floor alone
    for k in range(2, 7):                       # then a step every 2 s: twice the floor
        assert at(0.9 + 2.0 * (k - 1) - 0.1, k - 1) is None
        assert at(0.9 + 2.0 * (k - 1), k) is None
    assert at(10.9 + 5.9, 6) is None            # 3 x 2 s = 6 s not yet exceeded
    msg, rank = at(10.9 + 6.1, 6)
    assert "did not complete step 7" in msg and rank == 0
    first = watchdog.Watchdog(Ctx, 1, WatchdogPolicy(floor_s=1.0, factor=3.0))
    first.array[1] = clock[0]
    assert first.check([_FakeProc()], [0]) is None
    clock[0] += 1.1
    first.array[1] = clock[0]
    assert "did not complete step 1" in first.check([_FakeProc()], [0])[0]


@pytest.mark.timeout(120)
def test_the_watchdog_does_not_fire_on_a_healthy_job():
    assert launch.spawn(_steps, 2, (None, 0, "sigstop", 30), timeout=100, watch=FAST_WATCH) == [0, 1]


def _write_and_raise():
    if dist.get_rank() == 1:
        print("loading shard 7 of 8", file=sys.stderr, flush=True)
        raise OSError("disk full on purpose")
    dist.barrier()


@pytest.mark.timeout(120)
def test_a_failing_rank_is_one_line_with_its_stderr_tail():
    with pytest.raises(launch.RankError) as err:
        launch.spawn(_write_and_raise, 2, timeout=100)
    e = err.value
    assert e.rank == 1 and "\n" not in e.summary, e.summary
    assert e.summary == "rank 1 failed: OSError: disk full on purpose"
    assert e.stderr_tail == ("loading shard 7 of 8",)
    assert "Traceback" in e.details


def _cli(*argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ringzero.cli", "train", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _ranks_of(pid: int) -> list[int]:
    """Pids of the spawned rank processes under `pid` (not multiprocessing's resource tracker)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    ranks = []
    for c in out:
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    ranks.append(c)
        except OSError:
            pass
    return sorted(ranks)


def _wait_for_step(proc: subprocess.Popen, nproc: int) -> list[int]:
    """Block until rank 0 logged a step; return the rank pids."""
    for line in proc.stdout:
        if line.startswith("step "):
            break
    ranks = _ranks_of(proc.pid)
    assert len(ranks) == nproc, ranks
    return ranks


def _gone(pids: list[int], within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig, code, words", [(signal.SIGTERM, 128 + 15, "SIGTERM"),
                                              (signal.SIGINT, 128 + 2, "interrupted")])
def test_a_signal_to_the_parent_stops_every_rank_with_one_line(sig, code, words):
    proc = _cli("--nproc", "2", "--steps", "100000", "--log-every", "1", *QUICK)
    ranks = _wait_for_step(proc, 2)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)             # Ctrl-C reaches the whole foreground group
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("ringzero: starting")]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert _gone(ranks), "ranks outlived their parent"


@pytest.mark.timeout(180)
def test_a_killed_parent_takes_its_ranks_along():
    proc = _cli("--nproc", "2", "--steps", "100000", "--log-every", "1", *QUICK)
    ranks = _wait_for_step(proc, 2)
    proc.kill()                                          # SIGKILL: no handler of the parent runs
    proc.wait(timeout=30)
    assert _gone(ranks), "ranks were orphaned"


@pytest.mark.timeout(180)
def test_a_rank_killed_mid_run_is_one_line_exit_1():
    proc = _cli("--nproc", "2", "--steps", "100000", "--log-every", "1", *QUICK)
    ranks = _wait_for_step(proc, 2)
    os.kill(ranks[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("ringzero: starting")]
    assert len(lines) == 1 and "rank 1 died" in lines[0], err
    assert _gone(ranks)


@pytest.mark.timeout(60)
def test_an_unwinding_that_hangs_after_a_signal_still_ends_the_job_in_one_line():
    """After Ctrl-C or SIGTERM the launcher unwinds; should that hang (here: a sleep stands for
    it), the armed exit kills the children, says the one line and exits with 128 + the signal."""
    code = ("import multiprocessing as mp, time\n"
            "from ringzero import cli\n"
            "if __name__ == '__main__':\n"
            "    child = mp.get_context('spawn').Process(target=time.sleep, args=(600,), daemon=True)\n"
            "    child.start()\n"
            "    print(child.pid, flush=True)\n"
            "    cli.UNWIND_S = 0.5\n"
            "    try:\n"
            "        cli._raise_interrupted(2, None)\n"
            "    except KeyboardInterrupt:\n"
            "        time.sleep(600)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ["ringzero: interrupted (Ctrl-C); every rank was stopped"], done.stderr
    assert _gone([int(done.stdout.split()[0])]), "the child outlived the exit"
