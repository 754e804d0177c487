"""Flight recorder: when each collective started and ended on this rank, and who it waited for.

Every public collective is recorded (`recorded`): the group's global ranks, its sequence number in
that group on this rank, the collective, the algorithm, the bytes of its buffer, the wall-clock
start and end, and its state. The last `KEEP` calls stay in `RECORDER` (as NCCL's flight recorder
keeps a ring of recent collectives to dump when one hangs); a `Timeline` collects every call made
while it is open, on any thread of the process.

Waiting, timed apart from moving bytes. A collective cannot finish on any rank before its last
member has entered it (every member's data is in the result), so rank i's call k spends
[start_i, min(max_j start_j, end_i)) waiting for peers that had not arrived and the rest moving and
reducing bytes: the arrival skew, as Holistic Trace Analysis measures stragglers from collective
start times. Calls are matched across ranks by (group ranks, sequence number). What a rank loses
to waiting is the part of those spans during which its computation was blocked: inside a call made
on the computing thread, or while that thread waited for the communication thread
(`blocking`). A communication thread that idles inside a bucket's all-reduce while
backward still runs loses the step nothing.
Start times are `time.time()`: one clock on one host; across hosts they need synchronized clocks
(NTP or PTP, far below the milliseconds a straggler costs).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch.distributed as dist

from ringzero.comm.config import beside_compute

KEEP = 64
"""Calls kept in `RECORDER`."""


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

    def key(self) -> tuple[tuple[int, ...], str, int]:
        return self.ranks, self.group, self.seq


RECORDER: deque[CallRecord] = deque(maxlen=KEEP)
_ACTIVE: list["Timeline"] = []
_SEQ: dict[tuple[tuple[int, ...], str], int] = {}
"""(group ranks, group name) -> calls started on that group: one counter per process group, since
two groups of the same ranks (used from two threads) must not share a numbering."""
_LOCK = threading.Lock()
_CURRENT = threading.local()


class Timeline:
    """Context manager: every collective call of this process while it is open, in start order, and
    the spans in which the computing thread blocked for communication (plain data once closed)."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []
        self.blocked: list[tuple[float, float]] = []

    def __enter__(self) -> "Timeline":
        with _LOCK:
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _LOCK:
            _ACTIVE.remove(self)


@contextlib.contextmanager
def blocking():
    """Mark a span in which the computing thread waits for the communication thread (on every open
    `Timeline`)."""
    t0 = time.time()
    try:
        yield
    finally:
        with _LOCK:
            for t in _ACTIVE:
                t.blocked.append((t0, time.time()))


def _group(group) -> tuple[tuple[int, ...], str] | None:
    """(ranks, name) of `group` (None: this rank is not in it, or there is no process group)."""
    if not dist.is_initialized():
        return None
    g = dist.group.WORLD if group is None else group
    if g == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    return tuple(dist.get_process_group_ranks(g)), str(getattr(g, "group_name", ""))


def started() -> dict[str, int]:
    """The highest sequence number started on each group ("r0,r1,...|name" -> seq)."""
    with _LOCK:
        return {",".join(map(str, ranks)) + "|" + name: n - 1 for (ranks, name), n in _SEQ.items()}


def _start(collective: str, group, nbytes: int) -> CallRecord | None:
    key = _group(group)
    if key is None:
        return None
    ranks = key[0]
    with _LOCK:
        seq = _SEQ.get(key, 0)
        _SEQ[key] = seq + 1
        rec = CallRecord(collective, ranks, seq, time.time(), group=key[1], bytes=nbytes, beside=beside_compute())
        RECORDER.append(rec)
        for t in _ACTIVE:
            t.calls.append(rec)
    return rec


def note_algorithm(algorithm: str) -> None:
    """Record the algorithm chosen for the call this thread is making (`auto` resolved)."""
    rec = getattr(_CURRENT, "rec", None)
    if rec is not None:
        rec.algorithm = algorithm


def _nbytes(args) -> int:
    sizes = [a.numel() * a.element_size() for a in args if hasattr(a, "element_size")]
    sizes += [sum(t.numel() * t.element_size() for t in a) for a in args
              if isinstance(a, (list, tuple)) and a and all(hasattr(t, "element_size") for t in a)]
    return max(sizes, default=0)


def recorded(collective: str):
    """Decorator for a public collective taking `group=`: record each call (see the module doc)."""
    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if getattr(_CURRENT, "rec", None) is not None:   # a collective inside one: part of it
                return fn(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            rec = _start(collective, bound.arguments.get("group"), _nbytes(bound.arguments.values()))
            if rec is None:
                return fn(*args, **kwargs)
            _CURRENT.rec = rec
            try:
                out = fn(*args, **kwargs)
                rec.state = "completed"
                return out
            except BaseException:
                rec.state = "failed"
                raise
            finally:
                rec.end, _CURRENT.rec = time.time(), None
        return call
    return wrap


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


def dump() -> list[dict]:
    """The recorder's calls, oldest first, as plain dicts (what a hang report prints)."""
    with _LOCK:
        return [dict(vars(r)) for r in RECORDER]
