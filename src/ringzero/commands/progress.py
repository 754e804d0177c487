"""A progress display on stderr for a command that may take long (`ringzero simulate`).

It appears only on a terminal and only once the work has taken `AFTER_S` (an answer that comes
at once never flickers a bar), and never under `--json` (stdout is then data a program reads) or
`--quiet`; it is transient, so what stays on the screen is the answer alone. A timer thread
starts it, so a single long computation with no step to report still shows that it is running.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

AFTER_S = 2.0
"""Seconds of work before the display appears."""
QUIET_HELP = "no progress display on stderr (it appears only on a terminal, after 2 s)"


def on_terminal() -> bool:
    return sys.stderr.isatty()


class Shown:
    """A rich progress bar over `total` parts (None: a pulsing bar), started after `AFTER_S`."""

    def __init__(self, what: str, total: int | None, enabled: bool) -> None:
        self.what, self.total, self.done, self.part = what, total, 0, ""
        self.bar = self.task = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(AFTER_S, self._start) if enabled else None
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        with self._lock:
            if self._timer is None:                      # finished while the timer fired
                return
            columns = [TextColumn("{task.description}"), BarColumn()]
            columns += [MofNCompleteColumn()] if self.total else []
            self.bar = Progress(*columns, TimeElapsedColumn(), console=Console(file=sys.stderr, force_terminal=True),
                                transient=True)
            self.task = self.bar.add_task(self._describe(), total=self.total, completed=max(0, self.done - 1))
            self.bar.start()

    def advance(self, part: str) -> None:
        """Say that `part` is under way (the parts before it done)."""
        with self._lock:
            self.done, self.part = self.done + 1, part
            if self.bar is not None:
                self.bar.update(self.task, completed=self.done - 1, description=self._describe())

    def _describe(self) -> str:
        return f"{self.what}: {self.part}" if self.part else self.what

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self.bar is not None:
                self.bar.stop()


@contextmanager
def shown(args, what: str, total: int | None = None):
    """A `Shown` for the command `args` ran with: enabled on a terminal, without --json or --quiet."""
    s = Shown(what, total, on_terminal() and not getattr(args, "json", False) and not getattr(args, "quiet", False))
    try:
        yield s
    finally:
        s.close()
