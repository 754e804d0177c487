"""Files the command line writes: one rule for all of them.

Every output path (`--json-report`, `--json FILE`, `--plot`, `--out`) is checked by `check` before
any work starts: its folder must exist and accept a new file (tried for real, since `os.access`
says yes for root on /proc and /sys), and the path must not be a folder. A missing folder is an
error everywhere, never created silently. The file is then written by `write_text` / `write_with`
into a temporary file beside it and renamed over the path, so a reader never sees half a file and
no temporary file is left behind on any failure; an error names the user's path, not the temporary.
A figure's path (`--plot`, `--pipeline-plot`) is checked by `plot_format`: its suffix names the
format, any that matplotlib writes (png, svg, pdf, ...), so every command accepts the same files.
"""

from __future__ import annotations

import os
import tempfile

from ringzero.errors import UsageError


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
    writable(folder, f"{flag} {text!r}")
    return full


def folder(path: str | os.PathLike, flag: str) -> str:
    """The absolute path of output folder `path` of option `flag` (it may not exist yet: then its
    parent must, and the folder is made only when written to), or UsageError saying why not."""
    text = os.fspath(path)
    if not text:
        raise UsageError(f"{flag} needs a folder name")
    full = os.path.abspath(text)
    if os.path.exists(full) and not os.path.isdir(full):
        raise UsageError(f"{flag} {text!r} is a file; give a folder")
    parent = full if os.path.isdir(full) else os.path.dirname(full)
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {text!r}: folder {parent!r} does not exist")
    writable(parent, f"{flag} {text!r}")
    return full


def writable(folder: str, what: str) -> None:
    """UsageError "WHAT: cannot write in FOLDER" unless a file can be made in `folder`: tried for
    real (`os.access` says yes for root on /proc and /sys), the trial removed."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".ringzero-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError(f"{what}: cannot write in {folder!r} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def not_an_input(path: str | os.PathLike, flag: str, inputs: dict[str, str | None],
                 folders: tuple[str, ...] = ("--data", "--resume", "the checkpoint")) -> None:
    """UsageError when output `path` of `flag` is one of the command's `inputs` (flag -> path), or
    lies inside an input of `folders`, whose files the command reads (a corpus folder, a
    checkpoint): a command never overwrites what it reads."""
    full = os.path.realpath(os.fspath(path))
    for other, given in inputs.items():
        if not given:
            continue
        theirs = os.path.realpath(given)
        inside = other in folders and full.startswith(theirs.rstrip(os.sep) + os.sep)
        if full == theirs or inside:
            raise UsageError(f"{flag} {os.fspath(path)!r} {'is inside' if inside else 'is'} {other} {given!r}: "
                             "a command never overwrites what it reads; give another file name")


def plot_formats() -> list[str]:
    """The file suffixes matplotlib writes a figure as, png first (the common case), then by name."""
    from matplotlib.backend_bases import FigureCanvasBase
    names = sorted(FigureCanvasBase.get_supported_filetypes())
    return ["png"] + [n for n in names if n != "png"]


def plot_format(path: str | os.PathLike, flag: str) -> str:
    """The format (matplotlib's name) of figure `path` of option `flag`, from its suffix, once `check`
    has accepted the path; UsageError naming the formats allowed when matplotlib writes no such file."""
    check(path, flag)
    text = os.fspath(path)
    suffix = os.path.splitext(text)[1].lower().removeprefix(".")
    allowed = plot_formats()
    listed = ", ".join("." + n for n in allowed)
    if not suffix:
        raise UsageError(f"{flag} {text!r} has no suffix to name its format; allowed: {listed}")
    if suffix not in allowed:
        raise UsageError(f"{flag} {text!r}: format .{suffix} is not one matplotlib writes; allowed: {listed}")
    return suffix


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
