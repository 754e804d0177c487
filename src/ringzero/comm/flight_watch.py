"""Which rank a hung collective waits for: every rank publishes its flight recorder to the job's store.

Each rank runs a daemon thread (`start`) that, every `PERIOD` seconds, writes to the rendezvous store
under "ringzero/flight/<rank>" (only when it changed) the highest sequence number it has started
on each of its groups, its collectives still in flight, and, once one of them has been in flight
for `DUMP_AFTER` seconds, its last `flight.KEEP` calls. A rank blocked inside a collective cannot
say so itself (its thread waits in C++), but this thread still runs.

When the job stalls, the launcher (`diagnose`) reads every rank's entry: a call seq s on group g is
waiting for the members whose highest started seq on g is below s, the ranks that never arrived;
it names the collective, its number and those ranks in one line, and writes every rank's last
calls to a JSON file (as NCCL's flight recorder dumps its ring buffer when a collective times out).

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

from ringzero.comm import flight

PERIOD = 0.5
DUMP_AFTER = 2.0
KEY = "ringzero/flight/{rank}"


def state(now: float | None = None) -> dict:
    """This rank's entry: {"seqs": {"0,1,2": highest started seq}, "inflight": [...], "recent": [...]}."""
    now = time.time() if now is None else now
    calls = flight.dump()
    inflight = [c for c in calls if c["end"] is None]
    out = {"seqs": flight.started(), "inflight": inflight}
    if any(now - c["start"] > DUMP_AFTER for c in inflight):
        out["recent"] = calls
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
            late = [c for c in mine["inflight"] if deadline_s is not None and now - c["start"] > deadline_s]
            if late:
                _abort(store, rank, late[0], deadline_s, world)
        except Exception:  # noqa: BLE001 - the store went away: the job is ending
            return


def _abort(store, rank: int, call: dict, deadline_s: float, world: int) -> None:
    """End this process: its collective `call` has been in flight past the deadline."""
    time.sleep(2 * PERIOD)                       # the other ranks' latest entries
    where = diagnose(store, range(world)) or (
        f"{call['collective']} #{call['seq']} ({call['algorithm']}, {call['bytes']} bytes) on ranks "
        f"{call['ranks']}: every member arrived, and it is still not done")
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


def _key(call: dict) -> str:
    """The group of `call` as `flight.started` names it."""
    return ",".join(map(str, call["ranks"])) + "|" + call["group"]


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


def missing(states: dict[int, dict]) -> list[tuple[dict, list[int]]]:
    """For every collective in flight (the oldest first, one per (group, seq)), the members that
    have not started it: [(call, ranks that never arrived)]."""
    seen, out = set(), []
    calls = sorted((c for s in states.values() for c in s["inflight"]), key=lambda c: c["start"])
    for c in calls:
        group = _key(c)
        if (group, c["seq"]) in seen:
            continue
        seen.add((group, c["seq"]))
        absent = [m for m in c["ranks"] if m not in states or states[m]["seqs"].get(group, -1) < c["seq"]]
        out.append((c, absent))
    return out


def diagnose(store, ranks) -> str:
    """One clause for a stalled job: the hung collective, its number and who never arrived; and the
    file with every rank's last calls ("" when no rank is inside a collective)."""
    states = read(store, ranks)
    hung = [(c, absent) for c, absent in missing(states) if absent]
    if not hung:
        return ""
    c, absent = hung[0]
    waiting = sorted(r for r, s in states.items() if any(x["seq"] == c["seq"] and x["ranks"] == c["ranks"]
                                                         for x in s["inflight"]))
    group = c["ranks"]
    last = {m: states[m]["seqs"].get(_key(c), -1) if m in states else None for m in absent}
    where = ", ".join(f"rank {m} (its last there: #{last[m]})" if last[m] is not None else f"rank {m} (no report)"
                      for m in absent)
    with tempfile.NamedTemporaryFile("w", prefix="ringzero-flight-", suffix=".json", delete=False) as f:
        json.dump({str(r): s.get("recent", s["inflight"]) for r, s in sorted(states.items())}, f, indent=1)
    return (f"{c['collective']} #{c['seq']} ({c['algorithm']}, {c['bytes']} bytes) on ranks {group}: "
            f"ranks {waiting} waited in it, {where} never arrived; every rank's last calls: {f.name}")
