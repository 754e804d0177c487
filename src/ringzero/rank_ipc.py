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

What travels over the pipes is bytes (`encode`, `decode`). multiprocessing's own pickler would
hand each tensor over as a file descriptor of shared memory, fetched from the sender's resource
sharer thread only when the receiver unpickles it: a rank that returns tensors and exits at once
has gone by then (its result is lost), and a rank that lives on (`RankPool`) keeps writing into
memory the parent took as its result, while a job's tensor arguments become one buffer that every
rank and the parent write. Here the tensors' data is copied into the message instead: the object
is pickled with every tensor replaced by its index in a list, and the list follows, written by
`torch.save` (each storage once: views of one tensor stay views of one storage on arrival). The
pickling stays in C (`reducer_override` is not called for floats, ints or strings), where
`torch.save` of the whole object would call its Python `persistent_id` on every float of a result
holding parameters as lists (seconds for a million).
"""

from __future__ import annotations

import fcntl
import io
import pickle
import queue
import tempfile
import threading
from multiprocessing import connection, reduction

import torch


class _Pickler(pickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []

    def reducer_override(self, obj):
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        self.tensors.append(obj)          # pickle's memo sends a tensor met twice as one
        return _tensor_at, (len(self.tensors) - 1,)


def _tensor_at(index: int):
    raise RuntimeError("rank_ipc: a tensor reference outside `decode`")   # `decode` resolves it


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors: list):
        super().__init__(file)
        self._tensors = tensors

    def find_class(self, module, name):
        if module == __name__ and name == "_tensor_at":
            return self._tensors.__getitem__
        return super().find_class(module, name)


def encode(item) -> bytes:
    """`item` (any picklable object, tensors included) as bytes that outlive the sender: the
    length of the pickled object (8 bytes), the object, then its tensors as `torch.save` wrote them."""
    main = io.BytesIO()
    pickler = _Pickler(main)
    pickler.dump(item)
    tail = io.BytesIO()
    if pickler.tensors:
        torch.save(pickler.tensors, tail)
    return len(main.getbuffer()).to_bytes(8, "little") + main.getvalue() + tail.getvalue()


def decode(data: bytes):
    """The object `encode` made. The tensors are loaded without `weights_only`: the bytes come from
    this job's own processes."""
    view = memoryview(data)
    n = int.from_bytes(view[:8], "little")
    tensors = torch.load(io.BytesIO(view[8 + n:]), weights_only=False) if len(view) > 8 + n else []
    return _Unpickler(io.BytesIO(view[8:8 + n]), tensors).load()


class Sender:
    """A rank's end of its result pipe: `put(item)`, as on a queue."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def put(self, item) -> None:
        self._conn.send_bytes(encode(item))      # encoded first: a failure sends nothing


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
                data = conn.recv_bytes()
            except (EOFError, OSError):
                self._open.remove(conn)
                continue
            return self._decode(self._readers.index(conn), data)
        raise queue.Empty

    @staticmethod
    def _decode(rank: int, data: bytes):
        try:
            return decode(data)
        except Exception as exc:      # e.g. a class the rank had and this process cannot import
            return "err", rank, f"its result could not be read back: {type(exc).__name__}: {exc}"

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
        self.put_encoded(encode(item))

    def put_encoded(self, data: bytes) -> None:
        """Send what `encode` made (one encoding serves every rank's inbox)."""
        self._send.send_bytes(data)

    def get(self):
        return decode(self._recv.recv_bytes())

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
