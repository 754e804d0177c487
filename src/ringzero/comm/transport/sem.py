"""Process-shared POSIX semaphores living inside a shared-memory segment, and the waiting policy.

`sem_init(sem, pshared=1, value)` on a `sem_t` in a MAP_SHARED mapping is the POSIX way for two
processes to count and wait on one semaphore (POSIX.1-2008, sem_init(3)): glibc's is a futex, so
`post` and `trywait` are one atomic operation each and a blocked `wait` sleeps in the kernel
until the peer posts. They are called through ctypes, which releases the GIL for the call, so a
thread blocked here leaves the interpreter to the rank's other threads. A semaphore post/wait
pair is also a release/acquire barrier: the bytes written before `post` are visible after `wait`
on any architecture, which is what the ring of slots relies on (no separate fences).

Waiting (`wait`): first a short spin of `trywait` and `os.sched_yield()` (a hand-off between
ranks on different cores completes in about a microsecond, well within it; on a core shared by
several ranks the yield gives the core to the peer that must post), then a blocking
`sem_timedwait` in slices of `SLICE_S`, after each of which `alive()` is asked whether the peer
can still post: a peer that died raises at once instead of leaving this rank waiting.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time

SEM_BYTES = 32
"""sizeof(sem_t) on 64-bit glibc (x86-64 and aarch64)."""
SPIN = 64
"""trywait + sched_yield rounds before blocking (about 30-60 µs on the development machine) when
this host has a core for every local rank; none when ranks share cores (`spin_rounds`)."""
SLICE_S = 0.1
"""A blocking wait's slice: how soon a dead peer is noticed."""

_libc = ctypes.CDLL(None, use_errno=True)
for _name in ("sem_init", "sem_post", "sem_trywait", "sem_timedwait", "sem_destroy"):
    getattr(_libc, _name).argtypes = [ctypes.c_void_p] + ([ctypes.c_int, ctypes.c_uint] if _name == "sem_init"
                                                          else [ctypes.c_void_p] if _name == "sem_timedwait" else [])
    getattr(_libc, _name).restype = ctypes.c_int


_rounds: list[int] = []


def _spin() -> int:
    if not _rounds:
        _rounds.append(spin_rounds())
    return _rounds[0]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class PeerGone(RuntimeError):
    """The process that should post this semaphore has exited."""


def spin_rounds() -> int:
    """`SPIN`, or 0 when this host's ranks outnumber the cores this process may run on: then a
    spinning rank holds a core its peer needs to produce what it waits for, and blocking at once
    hands the core over (RINGZERO_SHM_SPIN overrides)."""
    env = os.environ.get("RINGZERO_SHM_SPIN")
    if env:
        return int(env)
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    return SPIN if ranks <= len(os.sched_getaffinity(0)) else 0


class Semaphore:
    """A process-shared semaphore at address `addr` of a mapping both processes hold."""

    __slots__ = ("addr",)

    def __init__(self, addr: int) -> None:
        self.addr = addr

    def init(self, value: int) -> None:
        """Initialise in place (once, by the segment's creator, before the peer attaches)."""
        if _libc.sem_init(self.addr, 1, value) != 0:
            raise OSError(ctypes.get_errno(), f"sem_init: {os.strerror(ctypes.get_errno())}")

    def post(self) -> None:
        _libc.sem_post(self.addr)

    def trywait(self) -> bool:
        return _libc.sem_trywait(self.addr) == 0

    def wait(self, alive, deadline: float) -> None:
        """Take one unit: spin briefly, then block in slices; raise `PeerGone` when `alive()` says
        the poster is gone, TimeoutError past `deadline` (time.monotonic())."""
        trywait = _libc.sem_trywait
        addr = self.addr
        for _ in range(_spin()):
            if trywait(addr) == 0:
                return
            os.sched_yield()
        ts = _Timespec()
        timed = _libc.sem_timedwait
        while True:
            now = time.time()
            until = now + SLICE_S
            ts.tv_sec, ts.tv_nsec = int(until), int((until % 1) * 1e9)
            if timed(addr, ctypes.byref(ts)) == 0:
                return
            err = ctypes.get_errno()
            if err not in (errno.ETIMEDOUT, errno.EINTR):
                raise OSError(err, f"sem_timedwait: {os.strerror(err)}")
            if err == errno.ETIMEDOUT:
                if not alive():
                    raise PeerGone("peer exited")
                if time.monotonic() > deadline:
                    raise TimeoutError("shared-memory transfer timed out")
