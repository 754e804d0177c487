"""A strict reader of the Chrome trace-event format, from the rules Perfetto and chrome://tracing
read by (Google's "Trace Event Format" document; Perfetto's JSON importer): every event has a
phase, a name, integer pid and tid and a finite non-negative `ts`; complete events (`X`) have a
non-negative `dur` and nest on their thread (two that overlap without one holding the other are
dropped by Perfetto); async begin/end pairs (`b`/`e`) match by (pid, cat, id, name), end no earlier
than they begin; flow events (`s`, `t`, `f`) of one id start once, end once, run forward in time,
and each point lies inside a complete event of its thread (the slice it binds to).
"""

from __future__ import annotations

import math

PHASES = {"X", "B", "E", "i", "I", "b", "e", "n", "s", "t", "f", "M", "C"}


def problems(doc: dict) -> list[str]:
    """Every rule `doc` (a loaded trace file) breaks, one line each (empty: it is valid)."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    out, slices, asyncs, flows = [], {}, {}, {}
    for i, e in enumerate(events):
        ph = e.get("ph")
        if ph not in PHASES:
            out.append(f"event {i}: unknown phase {ph!r}")
            continue
        if not isinstance(e.get("name"), str) or not isinstance(e.get("pid"), int) or not isinstance(e.get("tid", 0), int):
            out.append(f"event {i}: needs a name and integer pid and tid")
            continue
        if ph == "M":
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            out.append(f"event {i} ({e['name']}): ts {ts!r} is not a finite time >= 0")
            continue
        if ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                out.append(f"event {i} ({e['name']}): a complete event needs dur >= 0")
                continue
            slices.setdefault((e["pid"], e["tid"]), []).append((ts, ts + e["dur"], e["name"]))
        elif ph in "be":
            asyncs.setdefault((e["pid"], e.get("cat"), e.get("id"), e["name"]), []).append((ph, ts))
        elif ph in "stf":
            flows.setdefault(e.get("id"), []).append((ph, ts, e["pid"], e["tid"]))
    out += _nesting(slices) + _pairs(asyncs) + _flows(flows, slices)
    return out


def _nesting(slices: dict) -> list[str]:
    out = []
    for (pid, tid), xs in slices.items():
        stack: list[tuple[float, float, str]] = []
        for a, b, name in sorted(xs, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= a + 1e-3:     # touching, to the ns
                stack.pop()
            if stack and b > stack[-1][1] + 1e-3:      # µs, to the ns the files keep
                out.append(f"pid {pid} tid {tid}: {name!r} [{a}, {b}] overlaps {stack[-1][2]!r} "
                           f"[{stack[-1][0]}, {stack[-1][1]}] without nesting")
            stack.append((a, b, name))
    return out


def _pairs(asyncs: dict) -> list[str]:
    out = []
    for key, marks in asyncs.items():
        depth = 0
        for ph, ts in sorted(marks, key=lambda m: (m[1], m[0] == "e")):
            depth += 1 if ph == "b" else -1
            if depth < 0:
                out.append(f"async {key}: an end without its begin")
                break
        if depth > 0:
            out.append(f"async {key}: a begin without its end")
    return out


def _flows(flows: dict, slices: dict) -> list[str]:
    out = []
    for fid, points in flows.items():
        kinds = [p[0] for p in points]
        if kinds.count("s") != 1 or kinds.count("f") != 1:
            out.append(f"flow {fid}: needs one start and one end, has {kinds}")
            continue
        order = sorted(points, key=lambda p: (p[1], "stf".index(p[0])))
        if order[0][0] != "s" or order[-1][0] != "f":
            out.append(f"flow {fid}: does not run forward in time")
        for ph, ts, pid, tid in points:
            if not any(a <= ts <= b for a, b, _ in slices.get((pid, tid), [])):
                out.append(f"flow {fid}: its {ph} point at {ts} on pid {pid} tid {tid} lies in no slice")
    return out
