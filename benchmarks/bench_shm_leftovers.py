"""kill -9 in the middle of shared-memory training: nothing is left in /dev/shm, nothing keeps running.

Each trial starts `ringzero train --nproc 4 --transport shm` in a session of its own, waits a random
2-6 s (the ranks are mid-step, their channels set up and in use), then SIGKILLs either one random
rank (the launcher must stop the rest and exit 1 with a line naming the rank) or the whole job,
launcher included (the ranks die with it). A trial passes when, within 30 s, no process of the job
is left and /dev/shm holds no `rz-*` segment made by any of its processes (the creator's pid is in
every name).

    .venv/bin/python benchmarks/bench_shm_leftovers.py [--trials 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

RINGZERO = str(Path(sys.executable).with_name("ringzero"))
CMD = [RINGZERO, "train", "--nproc", "4", "--transport", "shm", "--steps", "100000", "--quiet",
       "--strategy", "zero2", "--eval-every", "1000000"]


def _tree(pid: int) -> set[int]:
    """`pid` and every descendant of it."""
    out, todo = {pid}, [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def _is_rank(pid: int) -> bool:
    """A spawned rank, not multiprocessing's resource tracker (also the launcher's child)."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _leftovers(pids: set[int]) -> list[str]:
    made = re.compile(r"^rz-[0-9a-f]+-(\d+)-")
    return [n for n in os.listdir("/dev/shm") if (m := made.match(n)) and int(m.group(1)) in pids]


def _running(pids: set[int]) -> list[int]:
    alive = []
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.append(p)
    return alive


def trial(rng: random.Random, whole: bool) -> tuple[bool, str]:
    job = subprocess.Popen(CMD, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(rng.uniform(2.0, 6.0))
    pids = _tree(job.pid)
    ranks = sorted(p for p in pids - {job.pid} if _is_rank(p))
    if job.poll() is not None or len(ranks) < 4:
        job.kill()
        return False, f"the job was not running ({len(ranks)} ranks): {job.stderr.read()[-300:]}"
    pids |= {p for r in ranks for p in _tree(r)}
    if whole:
        os.killpg(job.pid, signal.SIGKILL)
        what = "the whole job"
    else:
        victim = rng.choice(ranks)
        os.kill(victim, signal.SIGKILL)
        what = f"rank pid {victim}"
    t0 = time.monotonic()
    try:
        job.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        return False, f"{what}: the launcher was still running after 30 s"
    while _running(pids) and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    err = job.stderr.read().strip().splitlines()
    left, running = _leftovers(pids), _running(pids)
    ok = not left and not running and (whole or job.returncode == 1)
    detail = (f"{what}: exit {job.returncode} after {time.monotonic() - t0:.1f} s, {len(left)} segments left, "
              f"{len(running)} processes running; last line: {err[-1] if err else ''}")
    return ok, detail


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng, passed = random.Random(args.seed), 0
    for i in range(args.trials):
        ok, detail = trial(rng, whole=i % 2 == 1)
        passed += ok
        print(f"trial {i + 1:2d}: {'ok  ' if ok else 'FAIL'} {detail}", flush=True)
    print(f"{passed}/{args.trials} trials left nothing behind")
    sys.exit(0 if passed == args.trials else 1)


if __name__ == "__main__":
    main()
