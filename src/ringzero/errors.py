"""The two kinds of failure the command line tells apart.

Bad input (a flag, a config file, an output path, a size that cannot fit) is a `UsageError`: one
line naming what is wrong and what is allowed, exit code 2, raised before any rank starts and before
anything is written. Everything that goes wrong after that is a runtime failure: one line naming
the rank and its error, exit code 1.
"""

from __future__ import annotations

import contextlib


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit code 2."""


@contextlib.contextmanager
def usage():
    """Within this block a ValueError is bad input: it leaves as a UsageError with the same text.

    Validation code raises plain ValueError (a frozen config's `__post_init__`, a parser); the
    command wraps its checking phase in `with usage():` so that only that phase maps to exit 2 and
    a ValueError from a bug later on shows as the runtime failure it is.
    """
    try:
        yield
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class Terminated(BaseException):
    """The process was asked to stop (SIGTERM: `kill`, a scheduler, Kubernetes); like
    KeyboardInterrupt for SIGINT, it unwinds so that every rank is stopped on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum
