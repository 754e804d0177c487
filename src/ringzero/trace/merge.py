"""Every rank on one clock: the offsets a merged trace applies, each collective's wait for its last
peer, and the flow events that join a collective's records across its member ranks.

Each rank's clock is mapped onto the grid's first rank's by the offsets measured before and after
the traced steps (`comm.clock`: Cristian's algorithm), interpolated linearly in between, so a
clock that drifts is followed. The reported alignment error is the larger of the two measurements'
bounds (half their shortest round trip) over the ranks.

Waiting is read as Holistic Trace Analysis reads stragglers: a collective cannot finish on any
member before the last one has entered it, so a member's wait is from its own start to the last
member's start (no later than its own end), on the common clock.
"""

from __future__ import annotations

from ringzero.trace.events import call_key, us


def shift_of(data: dict):
    """`data`'s rank's clock -> the first rank's (a function of `time.time()` readings). It never
    runs backwards (a later reading maps no earlier), so spans nested on the rank's clock stay
    nested on the merged one (`events.interval`)."""
    r, clock = data["rank"], data["clock"]
    a, b = clock["start"], clock["end"]
    oa, ob = a["offsets"][r]["offset_s"], b["offsets"][r]["offset_s"]
    span = b["at"] - a["at"]
    if abs(ob - oa) >= span / 2:
        # no clock drifts by half the time it runs: this is the measurements' noise (a loaded
        # machine's round trips), and followed it would map later readings earlier
        oa = ob = (oa + ob) / 2

    def shift(t: float) -> float:
        w = (t - a["at"]) / span if span > 0 else 0.0
        return t - (oa + (ob - oa) * min(1.0, max(0.0, w)))
    return shift


def alignment(datas: list[dict]) -> dict:
    """The merged clock's figures: every rank's offsets (µs) and the error bound and drift (µs)."""
    ranks = {d["rank"]: d for d in datas}
    first = ranks[min(ranks)]["clock"]
    start, end = first["start"]["offsets"], first["end"]["offsets"]
    return {"method": "Cristian's algorithm against rank 0, before and after the traced steps, interpolated",
            "offsets_us": {r: [us(start[r]["offset_s"]), us(end[r]["offset_s"])] for r in sorted(ranks)},
            "alignment_error_us": max(us(max(start[r]["error_s"], end[r]["error_s"])) for r in sorted(ranks)),
            "drift_us": max(abs(us(end[r]["offset_s"] - start[r]["offset_s"])) for r in sorted(ranks))}


def waits(datas: list[dict]) -> dict[int, dict[tuple, float]]:
    """rank -> call key -> seconds it waited for the call's last member (calls whose every member
    is among `datas` and has ended)."""
    shifts = {d["rank"]: shift_of(d) for d in datas}
    latest: dict[tuple, float] = {}
    seen: dict[tuple, int] = {}
    for d in datas:
        for c in d["calls"]:
            k, t = call_key(c), shifts[d["rank"]](c["start"])
            latest[k], seen[k] = max(latest.get(k, t), t), seen.get(k, 0) + 1
    out: dict[int, dict[tuple, float]] = {}
    for d in datas:
        sh, mine = shifts[d["rank"]], out.setdefault(d["rank"], {})
        for c in d["calls"]:
            k = call_key(c)
            if c["end"] is not None and seen[k] == len(c["ranks"]):
                start, end = sh(c["start"]), sh(c["end"])
                mine[k] = max(0.0, min(latest[k], end) - start)
    return out


def flows(events_by_rank: dict[int, list[dict]]) -> list[dict]:
    """Flow events (`s` at the first member to arrive, `t` at the next, `f` at the last) joining
    each collective's complete events across the ranks that hold it."""
    members: dict[tuple, list[dict]] = {}
    for evs in events_by_rank.values():
        for e in evs:
            if e.get("cat") == "collective" and e["ph"] == "X":
                a = e["args"]
                members.setdefault((tuple(a["Process Group Ranks"]), a["Process Group Name"], a["seq"]), []).append(e)
    out = []
    for i, (key, evs) in enumerate(sorted(members.items(), key=lambda kv: min(e["ts"] for e in kv[1]))):
        if len(evs) < 2:
            continue
        evs = sorted(evs, key=lambda e: (e["ts"], e["pid"]))
        for j, e in enumerate(evs):
            ph = "s" if j == 0 else "f" if j == len(evs) - 1 else "t"
            flow = {"ph": ph, "id": i + 1, "name": e["name"], "cat": "collective flow", "pid": e["pid"],
                    "tid": e["tid"], "ts": e["ts"]}
            out.append(flow if ph == "s" else {**flow, "bp": "e"})
    return out
