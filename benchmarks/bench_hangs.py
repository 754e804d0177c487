"""Hang trials: a rank freezes, skips a collective or calls another one, and the flight recorder says which.

    python benchmarks/bench_hangs.py [--trials 20] [--seed 0]

Each trial starts 2 to 4 fresh gloo ranks (`ringzero.launch.spawn`, as `ringzero train` starts
them, with its progress watchdog) on a loop of steps, each an all-reduce then an all-gather. At a
random step one rank chosen at random, in turn
- freezes (sleeps for an hour) before one of the two collectives, or
- skips one of them (its next call then stands where its peers' skipped one does), or
- calls a gather (to itself) in place of one of them.
The job must end (the watchdog stops it, its error line naming the collective and the ranks at
fault: `comm.flight_watch.diagnose`), and `comm.flight_analysis.verdict` on the dump that line
points to must name the same collective (its name and sequence number) and only that rank (the
missing rank, or the culprit of the mismatch), each trial within 60 s. A skip or a substitution
runs on 3 or 4 ranks: with two ranks that disagree no record can say which one is wrong.

RINGZERO_CHECKS is off here: with it on, the metadata handshake stops a mismatch with its own
error before anything hangs. Prints one row per trial and "N/N named correctly, slowest S s";
exits 1 unless every trial named its hang correctly.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time

os.environ["RINGZERO_CHECKS"] = "0"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ringzero import comm, launch  # noqa: E402
from ringzero.comm import flight_analysis  # noqa: E402
from ringzero.watchdog import WatchdogPolicy, beacon  # noqa: E402

STEPS = 40
WATCH = WatchdogPolicy(floor_s=3.0, factor=20.0)
"""A stall is called after 3 s without a step (the steps take well under 0.15 s)."""
LIMIT_S = 60.0
OPS = ("all_reduce", "all_gather")


def _call(op: str, x: torch.Tensor, y: torch.Tensor) -> None:
    if op == "all_reduce":
        comm.all_reduce(x, algorithm="ring")
    elif op == "all_gather":
        comm.all_gather([torch.empty_like(y) for _ in range(dist.get_world_size())], y)
    else:
        # Another collective, rooted here so that this rank only receives, into buffers larger
        # than any message of its peers: they wait for it, and gloo has no message too large to
        # refuse (a rank receiving more bytes than it posted aborts its process instead of hanging).
        me, big = dist.get_rank(), [torch.empty(16 * y.numel()) for _ in range(dist.get_world_size())]
        comm.gather(torch.empty(16 * y.numel()), gather_list=big, dst=me)


def _job(how: str, victim: int, step: int, which: int) -> None:
    """The ranks' loop; rank `victim` does `how` at collective `which` of step `step`. Every message
    is 16 floats (the ring all-reduce's chunks, the all-gather's), so a rank that skips a call
    never sends its peers more bytes than they posted for."""
    y = torch.ones(16)
    x = torch.ones(dist.get_world_size() * y.numel())
    for k in range(STEPS):
        for i, op in enumerate(OPS):
            if dist.get_rank() == victim and (k, i) == (step, which):
                if how == "frozen":
                    time.sleep(3600)            # alive (its threads run) but never arrives
                elif how == "other":
                    _call("gather", x, y)
                continue                        # "skip": on to the next call
            _call(op, x, y)
        beacon().step_done(k + 1)
        time.sleep(0.02)
    beacon().finished()


def named(line: str) -> tuple[str, int, set[int]] | None:
    """(collective, sequence number, ranks at fault) that a verdict names (None: none)."""
    op, seq = re.search(r"collective: \w+:(\w+)", line), re.search(r"sequence number: (\d+)", line)
    missing = re.search(r"missing ranks: \{([\d, ]+)\}", line)
    ranks = {int(r) for r in missing.group(1).split(",")} if missing else {
        int(r) for r in re.findall(r"Culprit rank (\d+)", line)}
    return (op.group(1), int(seq.group(1)), ranks) if op and seq and ranks else None


HOWS = ("frozen", "skip", "other")


def trial(how: str, rng: random.Random) -> tuple[str, str, float, bool]:
    """One injected hang of kind `how`: (what was injected, what the verdict named, seconds, right)."""
    nproc = rng.randint(2, 4) if how == "frozen" else rng.randint(3, 4)
    victim, step, which = rng.randrange(nproc), rng.randint(2, 8), rng.randrange(len(OPS))
    expected = (OPS[which], 2 * step + which, {victim})
    what = f"{nproc} ranks: rank {victim} {how} {OPS[which]} #{expected[1]}"
    t0 = time.monotonic()
    try:
        launch.spawn(_job, nproc, (how, victim, step, which), timeout=LIMIT_S, watch=WATCH)
        return what, "the job did not hang", time.monotonic() - t0, False
    except launch.RankError as err:
        took, line = time.monotonic() - t0, err.summary
    path = line.rsplit(": ", 1)[1] if line.endswith(".json") else None
    if path is None:
        return what, f"no flight dump: {line[:120]}", took, False
    try:
        verdict = flight_analysis.verdict(flight_analysis.load(path))
    finally:
        os.remove(path)
    got = named(verdict)
    said = f"{got[0]} #{got[1]}, ranks {sorted(got[2])}" if got else verdict[:80]
    # The stall line names the same collective and rank as the verdict.
    stall = f"{OPS[which]} #{expected[1]} (" in line and re.search(rf"\brank {victim}\b", line) is not None
    return what, said, took, got == expected and stall and took <= LIMIT_S


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"{'trial':>5}  {'injected':<40} {'named':<36} {'seconds':>7}", flush=True)
    good, slowest = 0, 0.0
    for i in range(args.trials):
        what, said, took, ok = trial(HOWS[i % len(HOWS)], rng)
        good += ok
        slowest = max(slowest, took)
        print(f"{i + 1:>5}  {what:<40} {said:<36} {took:>7.1f}{'' if ok else '  FAIL'}", flush=True)
    print(f"{good}/{args.trials} named correctly, slowest {slowest:.1f} s", flush=True)
    return 0 if good == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
