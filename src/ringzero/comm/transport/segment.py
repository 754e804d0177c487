"""A shared-memory segment between two ranks of one host: created private, checked, named briefly.

A segment is a file in /dev/shm (tmpfs: memory, never disk) that its creator opens with
O_CREAT | O_EXCL | O_NOFOLLOW and mode 0600, so no other user can read it and no name planted in
advance (a file or a symbolic link) is ever used; both sides map it MAP_SHARED. The name carries
the job's random token, the creator's pid, the group and the pair:

    /dev/shm/rz-<token>-<creator pid>-<group>-<src>-<dst>

The peer opens it, refuses it unless its owner is this user, its mode is 0600 and its size the
expected one, maps it, and unlinks the name at once: from then on only the two mappings hold the
memory, and when both processes end, by exit or by `kill -9`, the kernel frees it (NCCL's SHM
transport does the same: names are unlinked as soon as the peer has opened them). A name that
outlives a job (its creator killed before its peer attached) is removed by `sweep`, which any later
ringzero process runs once: it unlinks this user's `rz-*` names whose creator pid is gone, and the
launcher sweeps its own job's token when the job ends.
"""

from __future__ import annotations

import mmap
import os
import re
import stat

DIR = "/dev/shm"
PREFIX = "rz-"
_NAME = re.compile(r"^rz-([0-9a-f]+)-(\d+)-")
"""A segment's name (or its draft's, `create`): the job's token and the creator's pid."""


class Refused(RuntimeError):
    """A segment that is not the one this rank expects (owner, mode or size)."""


def name(token: str, creator: int, group: str, src: int, dst: int) -> str:
    return f"{PREFIX}{token}-{creator}-{group}-{src}-{dst}"


def create(seg: str, size: int, init=None) -> mmap.mmap:
    """Create segment `seg` of `size` bytes, mode 0600, map it, fill it with `init(mm)`, and only then
    give it its name: it is made under a name of its own (`seg` + ".new") and hard-linked to `seg`,
    which fails if `seg` exists (never reuse a name someone else may have made), so a peer never
    sees it half made."""
    draft = os.path.join(DIR, seg + ".new")
    fd = os.open(draft, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)                    # whatever the umask left
        try:
            # Reserve the pages now: a full tmpfs then fails here with ENOSPC, where a sparse file
            # would kill the rank with SIGBUS at its first write into a page it cannot have.
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            raise OSError(exc.errno, f"{DIR} has no room for a {size >> 20} MiB shared-memory channel "
                                     f"({exc.strerror}); use transport gloo") from None
        mm = mmap.mmap(fd, size)
        if init is not None:
            init(mm)
        os.link(draft, os.path.join(DIR, seg))
        return mm
    finally:
        os.close(fd)
        os.unlink(draft)


def attach(seg: str, size: int) -> mmap.mmap | None:
    """Map segment `seg` if it exists (None if not yet), after checking it is this user's, private
    and `size` bytes; raises `Refused` otherwise. The caller unlinks the name once it is attached."""
    try:
        fd = os.open(os.path.join(DIR, seg), os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600 or not stat.S_ISREG(st.st_mode):
            raise Refused(f"{DIR}/{seg}: owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; "
                          f"expected uid {os.getuid()}, mode 600")
        if st.st_size != size:
            raise Refused(f"{DIR}/{seg}: {st.st_size} bytes, expected {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unlink(seg: str) -> None:
    try:
        os.unlink(os.path.join(DIR, seg))
    except FileNotFoundError:
        pass


def alive(pid: int) -> bool:
    """Whether process `pid` (of this pid namespace) still runs: it exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in (b"Z", b"X")


def sweep(token: str | None = None) -> list[str]:
    """Unlink this user's ringzero segments left behind: every one of `token` when given (its job has
    ended), else those whose creator is no longer running. Returns the names removed."""
    removed = []
    try:
        entries = os.listdir(DIR)
    except OSError:
        return removed
    for entry in entries:
        m = _NAME.match(entry)
        if not m or (token is not None and m.group(1) != token):
            continue
        if token is None and alive(int(m.group(2))):
            continue
        try:
            if os.stat(os.path.join(DIR, entry), follow_symlinks=False).st_uid == os.getuid():
                os.unlink(os.path.join(DIR, entry))
                removed.append(entry)
        except OSError:
            pass
    return removed


def free_bytes() -> int:
    """Bytes /dev/shm can still hold (0 when there is none)."""
    try:
        st = os.statvfs(DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize
