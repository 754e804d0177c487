"""What a rank's collectives looked like in time, as plain data, and who waited for whom.

`CallRecord` is one collective call on one rank (recorded by `comm.flight`), with the traffic it
put on the wire (`counts`, counted by `comm.meter` while the call is this thread's `current`); a
`Timeline` collects every call a process makes while it is open, its point-to-point posts, the
spans its computing thread blocked for communication (`blocking`) and the named spans and instants
the engine marks (`span`, `instant`: phases, micro-batches, saves, probes), each with its thread.
`waits` reads one step's timelines of every rank. torch-free: the records cross process boundaries
and the reports and traces read them without torch.

Waiting, timed apart from moving bytes. A collective cannot finish on any rank before its last
member has entered it (every member's data is in the result), so rank i's call k spends
[start_i, min(max_j start_j, end_i)) waiting for peers that had not arrived and the rest moving and
reducing bytes: the arrival skew, as Holistic Trace Analysis measures stragglers from collective
start times. Calls are matched across ranks by (group ranks, sequence number). What a rank loses
to waiting is the part of those spans during which its computation was blocked: inside a call made
on the computing thread, or while that thread waited for the communication thread
(`blocking`). A communication thread that idles inside a bucket's all-reduce while
backward still runs loses the step nothing.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import dataclass, field

LOCK = threading.Lock()
OPEN: list["Timeline"] = []
"""The open timelines, which `comm.flight` appends each new call to."""
_THREAD = threading.local()


@dataclass
class CallRecord:
    """One collective call on this rank (plain data: it crosses process boundaries)."""

    collective: str
    ranks: tuple[int, ...]
    """The group's global ranks (the whole job's for the default group)."""
    seq: int
    """This call's index among this rank's calls on the group (0-based)."""
    start: float
    algorithm: str = "auto"
    bytes: int = 0
    """The call's buffer on this rank, bytes (the largest tensor argument)."""
    end: float | None = None
    state: str = "started"
    """"started", "completed" or "failed"."""
    beside: bool = False
    """Made on a communication thread beside computation (`config.mark_beside_compute`): the
    computing thread is not blocked by it."""
    group: str = ""
    """The process group's name (two groups may have the same ranks)."""
    kind: str = "other"
    """What the call is for (`comm.kinds`)."""
    thread: str = ""
    """The name of the thread that made it."""
    counts: list[int] | None = None
    """Its traffic on this rank, `plan.comm.volume.FIELDS` in order (None: not counted)."""
    detail: dict = field(default_factory=dict)
    """A point-to-point post's peers and tag ({"sends": [[peer, bytes]], "recvs": ..., "tag"})."""

    def key(self) -> tuple[tuple[int, ...], str, int]:
        return self.ranks, self.group, self.seq


@dataclass
class Span:
    """A named span of one thread (an instant when `end` is `start`)."""

    name: str
    cat: str
    """"phase" (a step's forward, backward, comm, optimizer, pipeline wait), "step", "checkpoint",
    "probe", "mark" (an instant: a skipped step), ..."""
    thread: str
    start: float
    end: float
    args: dict = field(default_factory=dict)


def current() -> CallRecord | None:
    """The collective call this thread is inside (its outermost), or None."""
    return getattr(_THREAD, "rec", None)


def set_current(rec: CallRecord | None) -> None:
    _THREAD.rec = rec


class Timeline:
    """Context manager: every collective call of this process while it is open, in start order, its
    point-to-point posts, the spans in which the computing thread blocked for communication, and
    the engine's named spans (plain data once closed)."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []
        self.p2p: list[CallRecord] = []
        self.blocked: list[tuple[float, float]] = []
        self.spans: list[Span] = []

    def __enter__(self) -> "Timeline":
        with LOCK:
            OPEN.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with LOCK:
            OPEN.remove(self)


@contextlib.contextmanager
def blocking():
    """Mark a span in which the computing thread waits for the communication thread (on every open
    `Timeline`)."""
    t0 = time.time()
    try:
        yield
    finally:
        with LOCK:
            for t in OPEN:
                t.blocked.append((t0, time.time()))


def add(attr: str, item) -> None:
    """Append `item` to list `attr` ("calls", "p2p", "spans") of every open timeline."""
    with LOCK:
        for t in OPEN:
            getattr(t, attr).append(item)


AROUND: list = []
"""Context-manager factories entered around every span and recorded collective, called with its
name ("forward", "all_reduce"; a profiler's ranges while `ringzero train --profile` runs,
`train.tracing`)."""


def record(name: str, cat: str, start: float, end: float, **args) -> None:
    """Record a span timed by the caller (`time.time()` readings) on every open timeline."""
    if OPEN:
        add("spans", Span(name, cat, threading.current_thread().name, start, end, args))


@contextlib.contextmanager
def span(name: str, cat: str = "phase", **args):
    """Record the block as a `Span` on every open timeline (nothing when none is open). Yields the
    span's args, which the block may add to."""
    if not OPEN:
        yield args
        return
    with contextlib.ExitStack() as stack:
        for enter in AROUND:
            stack.enter_context(enter(name))
        t0 = time.time()
        try:
            yield args
        finally:
            record(name, cat, t0, time.time(), **args)


def spanned(name: str, cat: str):
    """Decorator: every call of the function is a `span` (on whichever thread runs it)."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            with span(name, cat):
                return fn(*args, **kwargs)
        return call
    return wrap


def instant(name: str, cat: str = "mark", **args) -> None:
    """Record a moment (a skipped step, a probe point) on every open timeline."""
    if OPEN:
        now = time.time()
        add("spans", Span(name, cat, threading.current_thread().name, now, now, args))


def _union(spans) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(xs, ys) -> float:
    """Length of (∪ xs) ∩ (∪ ys)."""
    xs, ys, i, j, total = _union(xs), _union(ys), 0, 0, 0.0
    while i < len(xs) and j < len(ys):
        total += max(0.0, min(xs[i][1], ys[j][1]) - max(xs[i][0], ys[j][0]))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def waits(logs: list[Timeline]) -> list[float]:
    """Seconds each rank (`logs[i]`: rank i's calls of one step) lost waiting for peers: the spans
    from its arrival to the last member's arrival, in its calls whose every member is among these
    logs, intersected with the spans its computing thread was blocked (see the module doc). Calls
    left without an end count 0."""
    latest: dict[tuple, float] = {}
    members: dict[tuple, int] = {}
    for log in logs:
        for c in log.calls:
            latest[c.key()] = max(latest.get(c.key(), c.start), c.start)
            members[c.key()] = members.get(c.key(), 0) + 1
    out = []
    for log in logs:
        done = [c for c in log.calls if c.end is not None and members[c.key()] == len(c.ranks)]
        waiting = [(c.start, min(latest[c.key()], c.end)) for c in done]
        blocked = log.blocked + [(c.start, c.end) for c in done if not c.beside]
        out.append(_overlap(waiting, blocked))
    return out
