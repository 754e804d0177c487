"""A spawned rank's ties to its parent: it dies with it, and its standard error goes through it.

- `die_with_parent`: on Linux, `prctl(PR_SET_PDEATHSIG, SIGKILL)` makes the kernel kill the rank
  when the thread that launched it ends, which for `ringzero`'s launcher (the main thread, waiting
  for results) is when the process dies, for any reason (SIGKILL included, where no handler of the
  parent can run): a killed `ringzero` never leaves ranks training as orphans. Elsewhere, or when
  the launching thread may end first, a thread polls the parent's pid.
- `redirect_stderr` points the rank's file descriptor 2 (Python's and C++'s messages alike) at a
  file; the parent's `StderrForwarder` copies each new line to its own standard error as
  `[rank r] ...` (as torchrun's `--tee` does) and keeps the last lines of each rank, which the
  launcher attaches to the error when that rank fails.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1      # <linux/prctl.h>
TAIL_LINES = 5


def in_torchrun() -> bool:
    """Whether this process is a rank of a torchrun job (which sets the world)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def die_with_parent(parent_pid: int, parent_thread_lasts: bool = True) -> None:
    """Arrange for this process to die when `parent_pid` (its launcher) does.

    The kernel's parent-death signal fires when the *thread* that started this process exits;
    when that thread may end before the parent (`parent_thread_lasts` False), poll instead.
    """
    armed = False
    if parent_thread_lasts:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:          # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


def redirect_stderr(path: str) -> None:
    """Send this process's file descriptor 2 to `path` (appending)."""
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


class StderrForwarder:
    """Parent side: copy new lines of each rank's stderr file to ours, prefixed; keep the tails."""

    def __init__(self, paths: list[str], period: float = 0.2) -> None:
        self.paths, self.period = paths, period
        self._pos = [0] * len(paths)
        self._partial = [b""] * len(paths)
        self._tails = [collections.deque(maxlen=TAIL_LINES) for _ in paths]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ringzero-stderr")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.poll()

    def poll(self) -> None:
        out = []
        with self._lock:
            for r, path in enumerate(self.paths):
                try:
                    with open(path, "rb") as f:
                        f.seek(self._pos[r])
                        data = f.read()
                except OSError:
                    continue
                if not data:
                    continue
                self._pos[r] += len(data)
                *lines, self._partial[r] = (self._partial[r] + data).split(b"\n")
                out += self._keep(r, lines)
        self._print(out)              # outside the lock: a full stderr pipe must not block tail()

    def _keep(self, rank: int, lines: list[bytes]) -> list[str]:
        kept = []
        for raw in lines:
            line = raw.decode(errors="replace").rstrip("\r")
            if line.strip():
                self._tails[rank].append(line)
                kept.append(f"[rank {rank}] {line}")
        return kept

    @staticmethod
    def _print(lines: list[str]) -> None:
        for line in lines:
            print(line, file=sys.stderr, flush=True)

    def tail(self, rank: int) -> tuple[str, ...]:
        """The last lines rank `rank` wrote (read up to now)."""
        self.poll()
        with self._lock:
            return tuple(self._tails[rank])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()
        out = []
        with self._lock:
            for r, rest in enumerate(self._partial):
                out += self._keep(r, [rest])
                self._partial[r] = b""
        self._print(out)
