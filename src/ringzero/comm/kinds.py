"""What a collective is for: the kind a call site gives its communication, so that a step's bytes
can be told apart (data-parallel reduction, ZeRO's gathers, tensor parallelism's, the pipeline's
messages, ...) on a trace and in the run report's byte twins per kind.

    with comm.kinds.kind("dp"):
        comm.all_reduce(bucket, group=dp_group)

The kind is thread-local; `carried` wraps a function so that it runs under the kind current where
it was wrapped (a collective queued for the communication thread keeps its caller's kind). The
innermost `kind` wins. A call made under none is "other". The names, and which of the planner's
calls each belongs to, are `plan.comm.kinds`'.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator

from ringzero.plan.comm import kinds as kinds_table

KINDS = kinds_table.KINDS
"""Every kind, with what it is for: `plan.comm.kinds.TABLE`, the table the planner's calls carry too."""

_LOCAL = threading.local()


def current() -> str:
    """The kind this thread's collectives are made under now."""
    return getattr(_LOCAL, "kind", "other")


@contextlib.contextmanager
def kind(name: str) -> Iterator[None]:
    """Make this thread's collectives inside the block of kind `name` (one of `KINDS`)."""
    if name not in KINDS:
        raise ValueError(f"unknown communication kind {name!r}; allowed: {', '.join(KINDS)}")
    before = current()
    _LOCAL.kind = name
    try:
        yield
    finally:
        _LOCAL.kind = before


def carried(fn):
    """`fn` bound to the kind current now: it runs under that kind on whichever thread calls it."""
    name = current()

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with kind(name):
            return fn(*args, **kwargs)
    return call


def tagged(name: str):
    """Decorator: the function's collectives are of kind `name` (`kind` around its body)."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            with kind(name):
                return fn(*args, **kwargs)
        return call
    return wrap
