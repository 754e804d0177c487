"""Which rank a hung collective waits for: every rank publishes its flight recorder to the job's store.

Each rank runs a daemon thread (`start`) that, every `PERIOD` seconds, writes to the rendezvous store
under "ringzero/flight/<rank>" (only when it changed) a dump in the layout of torch's flight
recorder (`flight.trace`): its groups (`pg_config`), the last sequence number it started and
completed on each (`pg_status`), and as `entries` its collectives still in flight, and once one of
them has been in flight for `DUMP_AFTER` seconds, its last `RECENT` calls as well (the recorder
keeps `flight.KEEP`, 2000 by default as torch's; 64 entries are about 40 kB, and the store holds
one per rank). A rank blocked inside a collective cannot say so itself (its thread waits in C++),
but this thread still runs.

When the job stalls, the launcher (`diagnose`) reads every rank's entry: a call with
`collective_seq_id` s on group g is waiting for the members whose `last_started_collective` on g is
below s, the ranks that never arrived; when every member arrived but some called another
collective there, it names the ranks that disagree. It says so in one line, and writes every rank's
dump to a JSON file ({rank: dump}, as NCCL's flight recorder dumps its ring buffer when a collective
times out; `comm.flight_analysis` reads it).

Under torchrun there is no ringzero launcher to notice the stall, so the thread also keeps the
deadline itself (`start(..., deadline_s=T)`, as NCCL's watchdog thread does): once one of its
rank's calls has been in flight T seconds it prints that line (`diagnose`) and ends the process
with exit code 1, and torchrun's agent stops the other ranks.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from ringzero.comm import flight, flight_analysis

PERIOD = 0.5
DUMP_AFTER = 2.0
RECENT = 64
"""Calls a rank stuck in a collective publishes (the newest; older ones in flight too)."""
KEY = "ringzero/flight/{rank}"


def _age(call: dict, now: float) -> float:
    return now - call["time_created_ns"] / 1e9


def _running(dump: dict) -> list[dict]:
    return [c for c in dump["entries"] if c["state"] == "started"]


def state(now: float | None = None) -> dict:
    """This rank's entry: `flight.trace` with the calls in flight as "entries", and the last
    `RECENT` calls too once one has been in flight longer than `DUMP_AFTER`."""
    now = time.time() if now is None else now
    out = flight.trace(last=0)
    if any(_age(c, now) > DUMP_AFTER for c in out["entries"]):
        out["entries"] = flight.dump(last=RECENT)
    return out


def _loop(store, rank: int, stop: threading.Event, deadline_s: float | None, world: int) -> None:
    last = None
    while not stop.wait(PERIOD):
        try:
            now = time.time()
            mine = state(now)
            text = json.dumps(mine)
            if text != last:
                store.set(KEY.format(rank=rank), text)
                last = text
            late = [c for c in _running(mine) if deadline_s is not None and _age(c, now) > deadline_s]
            if late:
                _abort(store, rank, late[0], deadline_s, world)
        except Exception:  # noqa: BLE001 - the store went away: the job is ending
            return


def name(call: dict) -> str:
    """"all_reduce #3 (ring, 4 bytes) on ranks [0, 1]": a call as the stall report names it."""
    op = call["profiling_name"].partition(":")[2]
    return f"{op} #{call['collective_seq_id']} ({call['algorithm']}, {call['bytes']} bytes) on ranks {call['ranks']}"


def _abort(store, rank: int, call: dict, deadline_s: float, world: int) -> None:
    """End this process: its collective `call` has been in flight past the deadline."""
    time.sleep(2 * PERIOD)                       # the other ranks' latest entries
    where = diagnose(store, range(world)) or f"{name(call)}: every member arrived, and it is still not done"
    sys.stderr.write(f"ringzero: rank {rank}: a collective did not complete in {deadline_s:g} s "
                     f"(--stall-timeout): {where}\n")
    sys.stderr.flush()
    os._exit(1)


def start(store, rank: int, deadline_s: float | None = None, world: int = 0) -> threading.Event:
    """Publish this rank's flight recorder to `store` until the returned event is set; with
    `deadline_s`, end the process once one of its `world` ranks' collectives is in flight longer."""
    stop = threading.Event()
    threading.Thread(target=_loop, args=(store, rank, stop, deadline_s, world), name="ringzero-flight",
                     daemon=True).start()
    return stop


def read(store, ranks) -> dict[int, dict]:
    """The entries of `ranks` that are in `store` (a rank that never published is left out)."""
    out = {}
    for r in ranks:
        key = KEY.format(rank=r)
        try:
            if store.check([key]):
                out[r] = json.loads(store.get(key))
        except Exception:  # noqa: BLE001 - a half-dead store: say what can be said
            continue
    return out


def last_started(dump: dict, call: dict) -> int:
    """The highest `collective_seq_id` the rank of `dump` started on `call`'s group (-1: none)."""
    return int(dump["pg_status"].get(str(call["pg_id"]), {}).get("last_started_collective", -1))


def missing(states: dict[int, dict]) -> list[tuple[dict, list[int]]]:
    """For every collective in flight (the oldest first, one per (group, seq)), the members that
    have not started it: [(call, ranks that never arrived)]."""
    seen, out = set(), []
    calls = sorted((c for s in states.values() for c in _running(s)), key=lambda c: c["time_created_ns"])
    for c in calls:
        if (c["pg_id"], c["collective_seq_id"]) in seen:
            continue
        seen.add((c["pg_id"], c["collective_seq_id"]))
        absent = [m for m in c["ranks"] if m not in states or last_started(states[m], c) < c["collective_seq_id"]]
        out.append((c, absent))
    return out


def _same(a: dict, b: dict) -> bool:
    return a["pg_id"] == b["pg_id"] and a["collective_seq_id"] == b["collective_seq_id"]


def _write(states: dict[int, dict]) -> str:
    with tempfile.NamedTemporaryFile("w", prefix="ringzero-flight-", suffix=".json", delete=False) as f:
        json.dump({str(r): s for r, s in sorted(states.items())}, f, indent=1)
    return f.name


def _disagreement(states: dict[int, dict], call: dict) -> str:
    """How `call`'s members, all arrived, disagree on it: some called another collective (or other
    sizes) as that call ("" when they agree)."""
    there = {r: e for r, s in sorted(states.items()) for e in s["entries"] if _same(e, call)}
    want = flight_analysis.majority(there)
    wrong = {r: e for r, e in there.items() if flight_analysis.mismatch(want, e)}
    if not wrong:
        return ""
    agree = sorted(r for r in there if r not in wrong)
    instead = ", ".join(f"rank {r} called {name(e)} there instead" for r, e in wrong.items())
    return f"{name(want)}: ranks {agree} waited in it, {instead}"


def _absence(states: dict[int, dict], call: dict, absent: list[int]) -> str:
    waiting = sorted(r for r, s in states.items() if any(_same(x, call) for x in _running(s)))
    last = {m: last_started(states[m], call) if m in states else None for m in absent}
    where = ", ".join(f"rank {m} (its last there: #{last[m]})" if last[m] is not None else f"rank {m} (no report)"
                      for m in absent)
    return f"{name(call)}: ranks {waiting} waited in it, {where} never arrived"


def diagnose(store, ranks) -> str:
    """One clause for a stalled job: the hung collective (the oldest call in flight that waits for a
    rank that never arrived, or whose members called different collectives there), its number and
    who is at fault; and the file with every rank's last calls ("" when no rank is inside a
    collective that waits for another)."""
    states = read(store, ranks)
    for c, absent in missing(states):
        what = _absence(states, c, absent) if absent else _disagreement(states, c)
        if what:
            return f"{what}; every rank's last calls: {_write(states)}"
    return ""
