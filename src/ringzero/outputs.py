"""Files the command line writes: one rule for all of them.

Every output path (`--json-report`, `--json FILE`, `--plot`, `--out`) is checked by `check` before
any work starts: its folder must exist and accept a new file (tried for real, since `os.access`
says yes for root on /proc and /sys), and the path must not be a folder. A missing folder is an
error everywhere, never created silently. The file is then written by `write_text` / `write_with`
into a temporary file beside it and renamed over the path, so a reader never sees half a file and
no temporary file is left behind on any failure; an error names the user's path, not the temporary.
"""

from __future__ import annotations

import os
import tempfile

from .errors import UsageError


def check(path: str | os.PathLike, flag: str) -> str:
    """The absolute path of output `path` of option `flag`, or UsageError saying why it cannot be written."""
    text = os.fspath(path)
    if not text:
        raise UsageError(f"{flag} needs a file name")
    full = os.path.abspath(text)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise UsageError(f"{flag} {text!r} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {text!r}: folder {folder!r} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ringzero-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError(f"{flag} {text!r}: cannot write in {folder!r} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    return full


def write_with(path: str | os.PathLike, writer, binary: bool = False) -> None:
    """Call `writer(f)` on a temporary file beside `path`, then rename it over `path` (atomic).

    Any failure removes the temporary file and raises OSError naming `path`.
    """
    full = os.path.abspath(os.fspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(full)}.", suffix=".tmp",
                                   dir=os.path.dirname(full))
        with os.fdopen(fd, "wb" if binary else "w") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)      # mkstemp makes the file private; an output is an ordinary file
        os.replace(tmp, full)
        tmp = None
    except OSError as exc:
        raise OSError(f"cannot write {os.fspath(path)!r}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (see `write_with`)."""
    write_with(path, lambda f: f.write(text))
