"""A progress watchdog for local ranks: a frozen or deadlocked job stops and says which rank stalled.

A collective that lost a live but silent peer (a rank under SIGSTOP, a deadlock, a rank stuck in an
endless loop) waits until the process group's timeout, 30 minutes by default, with no word. Here
each rank writes to a small block of shared memory: the steps it has completed, and a heartbeat
from a thread of its own that ticks every `HEARTBEAT_S` while the process runs (a stopped process
stops ticking; a deadlocked one keeps ticking but completes no step). The parent checks it while it
waits for results: once every rank has started, each next step must complete within
`max(floor_s, factor x the slowest step seen so far)` (the first step, which also builds the model
and warms up, within `floor_s`); when none does, the job stops and the error says which ranks did
not complete the step and which of them are frozen.

Rank side: `beacon()` is this process's `Beacon` (a no-op outside a watched job), and the training
loop calls `beacon().step_done(n)` after step n and `beacon().finished()` when it stops stepping
(evaluation, reports and shutdown are then not held to the step bound).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

HEARTBEAT_S = 0.5
FROZEN_S = 5.0
"""A rank whose heartbeat is older than this is frozen (not scheduled, or stopped)."""

_STEPS, _BEAT, _DONE = range(3)


@dataclass(frozen=True, kw_only=True)
class WatchdogPolicy:
    floor_s: float = 120.0
    """No bound is shorter than this. It alone bounds the first step, which also builds the
    model and warms up (evaluation and probes run between some later steps)."""
    factor: float = 20.0
    """The bound is this many times the longest interval between completed steps seen so far
    (the first step's included, from start-up on)."""

    def __post_init__(self) -> None:
        if not self.floor_s > 0 or not self.factor >= 1:
            raise ValueError(f"--stall-timeout must be > 0 seconds, got {self.floor_s:g}"
                             if not self.floor_s > 0 else f"watchdog factor must be >= 1, got {self.factor}")


class Beacon:
    """A rank's view of its slots in the shared array (see the module doc)."""

    def __init__(self, array=None, rank: int = 0) -> None:
        self._a, self._base = array, 3 * rank
        if array is not None:
            self._set(_BEAT, time.monotonic())
            threading.Thread(target=self._tick, daemon=True, name="ringzero-heartbeat").start()

    def _set(self, slot: int, value: float) -> None:
        self._a[self._base + slot] = value

    def _tick(self) -> None:
        while True:
            self._set(_BEAT, time.monotonic())
            time.sleep(HEARTBEAT_S)

    def step_done(self, steps: int) -> None:
        """This rank has completed `steps` steps."""
        if self._a is not None:
            self._set(_STEPS, steps)

    def finished(self) -> None:
        """This rank takes no more steps; the step bound no longer applies to it."""
        if self._a is not None:
            self._set(_DONE, 1)


_beacon = Beacon()


def beacon() -> Beacon:
    """This process's beacon (a no-op unless the launcher installed one)."""
    return _beacon


def install(array, rank: int) -> None:
    """Called by the launcher on each rank before the job runs."""
    global _beacon
    _beacon = Beacon(array, rank)


def _stopped(pid: int | None) -> bool:
    """Whether the kernel reports `pid` as stopped (SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError, TypeError):
        return False


class Watchdog:
    """Parent side: owns the shared array and decides when the job has stalled."""

    def __init__(self, ctx, nproc: int, policy: WatchdogPolicy) -> None:
        self.policy, self.nproc = policy, nproc
        self.array = ctx.Array("d", 3 * nproc, lock=False)
        self._last_min, self._last_change, self._longest = -1, 0.0, 0.0

    def _slot(self, rank: int, slot: int) -> float:
        return self.array[3 * rank + slot]

    def bound(self) -> float:
        """Seconds the next step may take: the floor, or `factor` x the slowest step seen."""
        return max(self.policy.floor_s, self.policy.factor * self._longest)

    def check(self, procs, pending) -> tuple[str, int | None] | None:
        """None while the job progresses; else (one line naming the ranks that stalled, the rank
        to blame when it is one)."""
        now = time.monotonic()
        if any(self._slot(r, _BEAT) == 0 for r in range(self.nproc)):
            return None                   # some rank is still starting: --timeout covers start-up
        active = [r for r in pending if not self._slot(r, _DONE)]
        if not active:
            return None
        steps = {r: int(self._slot(r, _STEPS)) for r in active}
        low = min(steps.values())
        if low != self._last_min:
            if self._last_min >= 0:
                self._longest = max(self._longest, now - self._last_change)
            self._last_min, self._last_change = low, now
            return None
        idle, bound = now - self._last_change, self.bound()
        if idle <= bound:
            return None
        behind = [r for r in active if steps[r] == low]
        frozen = [r for r in behind if _stopped(procs[r].pid) or now - self._slot(r, _BEAT) > FROZEN_S]
        ahead = sorted(set(active) - set(behind))
        msg = (f"no progress for {idle:.0f}s (bound {bound:.0f}s: the larger of {self.policy.floor_s:g}s "
               f"and {self.policy.factor:g} x the slowest step so far, {self._longest:.2f}s): "
               f"ranks {behind} did not complete step {low + 1}")
        if frozen:
            msg += f"; ranks {frozen} are frozen (stopped or not scheduled)"
        elif not ahead:
            msg += " and all are alive (a deadlock, or a rank stuck in a loop)"
        if ahead:
            msg += f"; ranks {ahead} did"
        culprits = frozen or behind
        return msg, (culprits[0] if len(culprits) == 1 else None)
