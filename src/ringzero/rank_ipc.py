"""What the launcher shares with its ranks, built so that a launcher killed with SIGKILL leaves nothing.

multiprocessing's `Queue` and locked `Array` are built on POSIX named semaphores. The process that
creates one registers its name with multiprocessing's resource tracker and unlinks it when the
object is collected; a parent killed with `kill -9` never does, so once its ranks have died with it
the tracker unlinks the names itself and prints "resource_tracker: There appear to be 4 leaked
semaphore objects to clean up at shutdown" (a results queue holds three, a locked array one).
Nothing here has a name to leak: results travel over one pipe per rank (`Results`), jobs over
another (`Inbox`), and the shared clocks of the link emulator live in an anonymous shared array
guarded by a POSIX record lock on an unlinked temporary file (`LockedArray`), all of which the
kernel frees with the last process that holds them.

Every object here is handed to a rank as an argument of `Process` (pickled while the rank is
spawned, which is how the file descriptors reach it).
"""

from __future__ import annotations

import fcntl
import queue
import tempfile
import threading
from multiprocessing import connection, reduction


class Sender:
    """A rank's end of its result pipe: `put(item)`, as on a queue."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def put(self, item) -> None:
        self._conn.send(item)


class Results:
    """The ranks' results: one pipe per rank, read by the parent with `get(timeout)` as from a queue
    (`queue.Empty` when nothing came in time). A rank that died closes its pipe; `get` then stops
    watching it (the caller notices the death itself, by its exit code)."""

    def __init__(self, ctx, nproc: int) -> None:
        pairs = [ctx.Pipe(duplex=False) for _ in range(nproc)]
        self._readers = [r for r, _ in pairs]
        self._writers = [w for _, w in pairs]
        self._open = list(self._readers)

    def sender(self, rank: int) -> Sender:
        return Sender(self._writers[rank])

    def started(self) -> None:
        """Call once every rank has started: the ranks hold the write ends now."""
        for w in self._writers:
            w.close()

    def get(self, timeout: float):
        for conn in connection.wait(self._open, timeout):
            try:
                return conn.recv()
            except (EOFError, OSError):
                self._open.remove(conn)
        raise queue.Empty

    def close(self) -> None:
        for c in self._readers + self._writers:
            c.close()


class Inbox:
    """Jobs for one rank: the parent `put`s, the rank `get`s (blocking), over one pipe."""

    def __init__(self, ctx) -> None:
        self._recv, self._send = ctx.Pipe(duplex=False)

    def __getstate__(self):
        return {"_recv": self._recv, "_send": None}      # the rank only reads

    def put(self, item) -> None:
        self._send.send(item)

    def get(self):
        return self._recv.recv()

    def close(self) -> None:
        for c in (self._recv, self._send):
            if c is not None:
                c.close()


class LockedArray:
    """`n` doubles shared by the launcher and its ranks, with `get_lock()` as on a locked
    `multiprocessing.Array`. The lock is a POSIX record lock (`lockf`) on one unlinked temporary
    file: such locks belong to a process, so ranks that inherited the same descriptor still exclude
    each other (a `flock` would not), the kernel drops a dead holder's lock, and the file has no
    name once created. A threading lock orders the threads of one process, which a record lock does
    not."""

    def __init__(self, ctx, n: int) -> None:
        self._array = ctx.RawArray("d", n)
        self._file = tempfile.TemporaryFile(prefix="ringzero-lock-")
        self._fd = self._file.fileno()
        self._threads = threading.Lock()

    def __reduce__(self):
        return _rebuild, (self._array, reduction.DupFd(self._fd))

    def __getitem__(self, i):
        return self._array[i]

    def __setitem__(self, i, value) -> None:
        self._array[i] = value

    def __len__(self) -> int:
        return len(self._array)

    def get_lock(self) -> "LockedArray":
        return self

    def __enter__(self) -> "LockedArray":
        self._threads.acquire()
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)
        self._threads.release()


def _rebuild(array, dup) -> LockedArray:
    self = LockedArray.__new__(LockedArray)
    self._array, self._file, self._fd = array, None, dup.detach()
    self._threads = threading.Lock()
    return self
