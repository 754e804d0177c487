"""Fault trials: kill -9 a random rank at a random moment, or the whole job in the middle of its saves.

    python benchmarks/bench_faults.py [--trials 20] [--nproc 3]

1. Rank deaths: `ringzero train` runs; after a random delay one of its ranks (chosen at random)
   gets SIGKILL. Every trial must end with exit code 1 within 60 s of the kill, on a line that
   names the rank that died.
2. Deaths during saves: a run that saves after every step gets SIGKILL on its whole process group
   at a random moment. Every trial, the folder must then hold a complete checkpoint; every folder
   that looks complete must hold every shard its manifest lists; `latest` must name one of the two
   newest (the kill may fall between a rename and `latest`); and the one the next --resume takes
   (the newest complete) must load, tensor by tensor.

Prints one line per trial and a summary; exits 1 if any trial fails.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

QUICK = ["--seq", "32", "--micro-batch", "2", "--max-bytes", "65536", "--eval-batches", "1", "--quiet"]


def _ranks(parent: int) -> list[int]:
    """The rank processes `ringzero` started (its spawned children, in start order)."""
    out = subprocess.run(["ps", "ww", "-o", "pid=,args=", "--ppid", str(parent), "--sort=start_time"],
                         capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line and "resource_tracker" not in line]


def rank_death(nproc: int, rng: random.Random) -> tuple[bool, str]:
    p = subprocess.Popen([sys.executable, "-m", "ringzero.cli", "train", "--nproc", str(nproc), "--steps", "400",
                          *QUICK], stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_ranks(p.pid)) < nproc and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        ranks = _ranks(p.pid)
        if len(ranks) < nproc:
            early = f"; it exited {p.returncode}: {p.communicate()[1][-300:]}" if p.poll() is not None else ""
            return False, f"only {len(ranks)} of {nproc} ranks started{early}"
        time.sleep(rng.uniform(0.0, 6.0))
        victim = rng.randrange(nproc)
        os.kill(ranks[victim], signal.SIGKILL)
        t0 = time.monotonic()
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            return False, f"rank {victim} killed: still running after 60 s"
        took = time.monotonic() - t0
        first = next((line for line in err.splitlines() if line.startswith("ringzero: error")), "")
        ok = p.returncode == 1 and re.search(rf"\brank {victim}\b", first) is not None and took <= 60
        return ok, f"rank {victim} killed: exit {p.returncode} after {took:.1f} s: {first[:110]}"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def save_death(nproc: int, rng: random.Random) -> tuple[bool, str]:
    from ringzero.checkpoint.folders import complete, resolve
    from ringzero.checkpoint.load import Reader
    from ringzero.checkpoint.manifest import read
    from ringzero.checkpoint.verify import verify
    with tempfile.TemporaryDirectory(prefix="ringzero-faults-") as root:
        ck = os.path.join(root, "ck")
        p = subprocess.Popen([sys.executable, "-m", "ringzero.cli", "train", "--nproc", str(nproc), "--steps", "400",
                              "--strategy", "zero2", "--save-dir", ck, "--save-every", "1", "--keep", "3", *QUICK],
                             stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while not complete(ck) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 3.0))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        done = complete(ck)
        if not done:
            return False, "no complete checkpoint after the kill"
        for name in done:                   # every folder that looks complete is whole: every shard, size and CRC-32
            try:
                verify(os.path.join(ck, name), read(os.path.join(ck, name)), deep=True)
            except ValueError as exc:
                return False, f"{name} looks complete but is not: {exc}"
        with open(os.path.join(ck, "latest"), encoding="utf-8") as f:
            latest = f.read().strip()
        if latest not in done[-2:]:         # the kill may fall between the rename and `latest`
            return False, f"latest names {latest}, not one of the newest complete {done[-2:]}"
        r = Reader(resolve(ck))
        for name in r.manifest.tensors:
            r.tensor(name)
        left = sorted(n for n in os.listdir(ck) if ".tmp" in n)
        return True, f"killed; resume takes {done[-1]} ({len(r.manifest.tensors)} tensors load); left: {left or 'nothing'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--nproc", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    failed = 0
    for kind, trial in (("rank death", rank_death), ("death during saves", save_death)):
        good = 0
        for i in range(args.trials):
            ok, what = trial(args.nproc, rng)
            good += ok
            print(f"{kind} {i + 1:2d}: {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        print(f"{kind}: {good}/{args.trials} as required", flush=True)
        failed += args.trials - good
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
