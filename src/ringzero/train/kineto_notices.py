"""Kineto's notices kept off the terminal: torch.profiler's C++ back end (Kineto) writes a line to
the process's standard error at every start and stop of a trace ("USDT:... profiler_start",
"STAGE:... Completed Stage: Warm Up"), below any log level its `KINETO_LOG_LEVEL` sets. They say
nothing a user of `--profile` acts on, so the standard error of those calls goes through a file and
comes back without them; any other line (a real warning or error) is written on as it came."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

NOTICE = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] ")
"""Kineto's notice: its tag, the date and time, pid:tid, the source line."""


@contextlib.contextmanager
def quiet() -> None:
    """File descriptor 2 into a temporary file during the block, then every line but Kineto's
    notices written back to it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [ln for ln in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not NOTICE.match(ln)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
