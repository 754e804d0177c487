"""Flight recorder: when each collective started and ended on this rank, and who it waited for.

Every public collective is recorded (`recorded`): the group's global ranks, its sequence number in
that group on this rank, the collective, the algorithm, the bytes of its buffer, the wall-clock
start and end, and its state. The last `KEEP` calls stay in `RECORDER` (as NCCL's flight recorder
keeps a ring of recent collectives to dump when one hangs); a `comm.timeline.Timeline` collects every
call made while it is open, on any thread of the process.

Waiting for peers is read from the records by `comm.timeline.waits`.
Start times are `time.time()`: one clock on one host; across hosts they need synchronized clocks
(NTP or PTP, far below the milliseconds a straggler costs).
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections import deque

import torch.distributed as dist

from ringzero.comm.config import beside_compute
from ringzero.comm.timeline import OPEN, LOCK, CallRecord

KEEP = 64
"""Calls kept in `RECORDER`."""


RECORDER: deque[CallRecord] = deque(maxlen=KEEP)
_SEQ: dict[tuple[tuple[int, ...], str], int] = {}
"""(group ranks, group name) -> calls started on that group: one counter per process group, since
two groups of the same ranks (used from two threads) must not share a numbering."""
_CURRENT = threading.local()


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
    with LOCK:
        return {",".join(map(str, ranks)) + "|" + name: n - 1 for (ranks, name), n in _SEQ.items()}


def _start(collective: str, group, nbytes: int) -> CallRecord | None:
    key = _group(group)
    if key is None:
        return None
    ranks = key[0]
    with LOCK:
        seq = _SEQ.get(key, 0)
        _SEQ[key] = seq + 1
        rec = CallRecord(collective, ranks, seq, time.time(), group=key[1], bytes=nbytes, beside=beside_compute())
        RECORDER.append(rec)
        for t in OPEN:
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


def dump() -> list[dict]:
    """The recorder's calls, oldest first, as plain dicts (what a hang report prints)."""
    with LOCK:
        return [dict(vars(r)) for r in RECORDER]
