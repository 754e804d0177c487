"""Flight recorder: when each collective started and ended on this rank, and who it waited for.

Every public collective is recorded (`recorded`): the group's global ranks, its sequence number in
that group on this rank, the collective, the algorithm, the bytes of its buffer, the wall-clock
start and end, and its state. The last `KEEP` calls stay in `RECORDER`, a ring as NCCL's flight
recorder keeps to dump when a collective hangs, sized as torch sizes its own: TORCH_FR_BUFFER_SIZE
or its older name TORCH_NCCL_TRACE_BUFFER_SIZE, default 2000, 0 keeps none (`buffer_size`). A
`comm.timeline.Timeline` collects every call made while it is open, on any thread of the process.

`dump` gives the kept calls as torch's flight recorder entries (`record_id`, `process_group`,
`collective_seq_id`, `profiling_name`, `state`, ...; torch's `fr_trace` analyzer reads the same
fields) and `trace` a whole dump in torch's layout: {"version", "pg_config", "pg_status", "entries"}.

Waiting for peers is read from the records by `comm.timeline.waits`.
Start times are `time.time()`: one clock on one host; across hosts they need synchronized clocks
(NTP or PTP, far below the milliseconds a straggler costs).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import time
import zlib
from collections import deque

import torch.distributed as dist

from ringzero.comm import kinds
from ringzero.comm.config import beside_compute
from ringzero.comm.timeline import AROUND, OPEN, LOCK, CallRecord, current, set_current
from ringzero.errors import UsageError
from ringzero.plan.comm.volume import FIELDS

BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""torch's names for its flight recorder's size (the first is its newer name); the first one set wins."""
DEFAULT_KEEP = 2000
"""torch's default size."""


def buffer_size(environ=os.environ) -> int:
    """Calls to keep, read as torch reads its own: the first of `BUFFER_ENV` that is set, else
    `DEFAULT_KEEP`; 0 keeps none (and a stalled job's report can then not name the collective)."""
    for name in BUFFER_ENV:
        raw = environ.get(name, "").strip()
        if raw:
            if not raw.isdigit():
                raise UsageError(f"{name}={raw!r}: give the number of collectives the flight recorder keeps "
                                 f"(a whole number >= 0; default {DEFAULT_KEEP})")
            return int(raw)
    return DEFAULT_KEEP


KEEP = buffer_size()
"""Calls kept in `RECORDER` (`buffer_size`, read when this module loads)."""


RECORDER: deque[CallRecord] = deque(maxlen=KEEP)
_SEQ: dict[tuple[tuple[int, ...], str], int] = {}
"""(group ranks, group name) -> calls started on that group: one counter per process group, since
two groups of the same ranks (used from two threads) must not share a numbering."""


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
        rec = CallRecord(collective, ranks, seq, time.time(), group=key[1], bytes=nbytes, beside=beside_compute(),
                         kind=kinds.current(), thread=threading.current_thread().name, counts=[0] * len(FIELDS))
        RECORDER.append(rec)
        for t in OPEN:
            t.calls.append(rec)
    return rec


def note_algorithm(algorithm: str) -> None:
    """Record the algorithm chosen for the call this thread is making (`auto` resolved)."""
    rec = current()
    if rec is not None:
        rec.algorithm = algorithm


_IN = {"input", "input_list", "scatter_list", "input_tensor_list"}
_OUT = {"output", "tensor_list", "gather_list", "output_tensor_list"}


def _elements(collective: str, arguments: dict) -> dict:
    """{"in_nelems", "out_nelems", "dtype"} of a call, as Kineto's collective records give them:
    `tensor` is the input of a (all-)gather, the output of a scatter, both otherwise; a list counts all
    its tensors (None, a non-root's list, counts 0)."""
    def count(v) -> int:
        if hasattr(v, "numel"):
            return v.numel()
        return sum(t.numel() for t in v) if isinstance(v, (list, tuple)) else 0
    tensor = arguments.get("tensor")
    ins = sum(count(v) for k, v in arguments.items() if k in _IN) + (count(tensor) if collective != "scatter" else 0)
    outs = sum(count(v) for k, v in arguments.items() if k in _OUT) + (count(tensor) if collective not in ("gather", "all_gather") else 0)
    first = next((v for v in arguments.values() if hasattr(v, "dtype")), None)
    return {"in_nelems": ins, "out_nelems": outs, "dtype": str(first.dtype).removeprefix("torch.") if first is not None else ""}


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
            if current() is not None:   # a collective inside one: part of it
                return fn(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            rec = _start(collective, bound.arguments.get("group"), _nbytes(bound.arguments.values()))
            if rec is None:
                return fn(*args, **kwargs)
            rec.detail = _elements(collective, bound.arguments)
            set_current(rec)
            try:
                with contextlib.ExitStack() as ranges:       # a profiler's ranges (`timeline.AROUND`)
                    for enter in AROUND:
                        ranges.enter_context(enter(collective))
                    out = fn(*args, **kwargs)
                rec.state = "completed"
                return out
            except BaseException:
                rec.state = "failed"
                raise
            finally:
                rec.end = time.time()
                set_current(None)
        return call
    return wrap


VERSION = "2.10"
"""The version of torch's dump format that `trace` follows (torch 2.13 writes "2.10")."""
_TORCH_DTYPE = {"float32": "Float", "float16": "Half", "bfloat16": "BFloat16", "float64": "Double",
                "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}
"""torch's dtype names in its entries (c10's ScalarType names)."""
_PG: dict[str, tuple[str, int | None]] = {}
"""Group name -> (torch's description of it, its timeout in ms), looked up once."""


def pg_id(name: str) -> int:
    """A group's number: its name when that is one (torch names groups "0", "1", ... in the order
    every rank makes them), else a hash of the name; the same on every rank either way."""
    return int(name) if name.isdigit() else zlib.crc32(name.encode())


def _pg(name: str) -> tuple[str, int | None]:
    """(desc, timeout ms) of the group named `name`: "default_pg" for the whole job's, the
    description given to `new_group` or "undefined", as torch's entries say; ("undefined", None)
    once the group is gone."""
    if name not in _PG:
        try:
            g = dist.distributed_c10d._resolve_process_group(name)
        except Exception:  # noqa: BLE001 - no process group (or it was destroyed): say less
            return "undefined", None
        try:
            timeout = g._get_backend(g._device_types[0]).options._timeout
            ms = int(timeout.total_seconds() * 1000)
        except Exception:  # noqa: BLE001 - a backend without options (or another torch)
            ms = None
        _PG[name] = (g.group_desc, ms)
    return _PG[name]


def _ns(t: float | None) -> int | None:
    return None if t is None else int(t * 1e9)


def _entry(rec: CallRecord, record_id: int) -> dict:
    """`rec` as one entry of torch's flight recorder (see `dump`)."""
    desc, timeout_ms = _pg(rec.group)
    done = rec.end is not None
    dtype = rec.detail.get("dtype", "")
    dtypes = [_TORCH_DTYPE.get(dtype, dtype)] if dtype else []
    return {"record_id": record_id, "pg_id": pg_id(rec.group), "process_group": [rec.group, desc],
            "collective_seq_id": rec.seq, "p2p_seq_id": 0, "op_id": rec.seq,
            "profiling_name": f"ringzero:{rec.collective}",
            "time_created_ns": _ns(rec.start), "time_discovered_started_ns": _ns(rec.start),
            "time_discovered_completed_ns": _ns(rec.end),
            "duration_ms": (rec.end - rec.start) * 1e3 if done else None,
            "input_sizes": [[rec.detail.get("in_nelems", 0)]], "input_dtypes": dtypes,
            "output_sizes": [[rec.detail.get("out_nelems", 0)]], "output_dtypes": dtypes,
            "state": rec.state if done else "started", "is_p2p": False, "retired": done,
            "timeout_ms": timeout_ms, "thread_name": rec.thread,
            "ranks": list(rec.ranks), "algorithm": rec.algorithm, "bytes": rec.bytes, "kind": rec.kind}


def dump(last: int | None = None) -> list[dict]:
    """The recorder's calls, oldest first, as torch's flight recorder entries: all of them, or the
    last `last` and any older one still in flight (`last=0`: those in flight only).

    torch's fields, and where ringzero's values differ from NCCL's:
    - `record_id`: the call's number among this rank's recorded calls; `pg_id` (`pg_id`) and
      `process_group` [name, desc] its group;
    - `collective_seq_id`: its number among this rank's calls on the group, counted from 0 (NCCL
      counts from 1), the "#3" of the stall report; `op_id` the same (ringzero coalesces nothing);
      `p2p_seq_id` 0 and `is_p2p` False: point-to-point posts are not recorded here
      (`Timeline.p2p` has them);
    - `profiling_name` "ringzero:all_reduce" (NCCL's "nccl:all_reduce");
    - `time_created_ns` and `time_discovered_started_ns` the start (a call runs as soon as it is
      made, on its caller's thread: none is ever "scheduled" and waiting), and
      `time_discovered_completed_ns`, `duration_ms` its end (None while it runs);
    - `input_sizes`, `output_sizes` [[elements]]: one total, not each tensor's shape (the recorder
      counts elements: a list argument's tensors are summed, a non-root's absent list is 0); the
      dtypes in torch's names (["Float"]), [] when no tensor was given;
    - `state` "started" while in flight, then "completed", or ringzero's "failed" (it raised);
      `retired` once it ended;
    - `timeout_ms` the group's timeout (gloo raises past it), None when unknown;
    - `thread_name` the thread that made it.
    ringzero's own: `ranks` (the group's global ranks), `algorithm`, `bytes` (the buffer on this
    rank), `kind` (`comm.kinds`).
    """
    with LOCK:
        recs = list(RECORDER)
        first = sum(_SEQ.values()) - len(recs)     # every started call was appended once
    keep = range(len(recs)) if last is None else [
        i for i, r in enumerate(recs) if i >= len(recs) - last or r.end is None]
    return [_entry(recs[i], first + i) for i in keep]


def pg_config() -> dict[str, dict]:
    """Each group this rank has called on, as torch's dump lists them: name -> {"name", "desc",
    "ranks"} (the ranks as a string, "[0, 1]", as torch writes them)."""
    with LOCK:
        keys = list(_SEQ)
    return {name: {"name": name, "desc": _pg(name)[0], "ranks": str(list(ranks))} for ranks, name in keys}


def pg_status() -> dict[str, dict]:
    """Each group's progress on this rank, as torch's dump gives it: str(pg_id) ->
    {"last_enqueued_collective", "last_started_collective", "last_completed_collective"} (-1:
    none). A call starts when it is made, so enqueued is started; completed is the last one below
    which every call has ended (failed ones included)."""
    with LOCK:
        started = {name: n - 1 for (_, name), n in _SEQ.items()}
        running = [(r.group, r.seq) for r in RECORDER if r.end is None]
    done = dict(started)
    for name, seq in running:
        done[name] = min(done[name], seq - 1)
    return {str(pg_id(name)): {"last_enqueued_collective": n, "last_started_collective": n,
                               "last_completed_collective": done[name]} for name, n in started.items()}


def trace(last: int | None = None) -> dict:
    """This rank's recorder in the layout of torch's dump: {"version", "pg_config", "pg_status",
    "entries"} (`dump(last)`)."""
    return {"version": VERSION, "pg_config": pg_config(), "pg_status": pg_status(), "entries": dump(last)}
