"""One rank's traced steps as Chrome trace events, in the format torch.profiler (Kineto) writes.

Complete events (`ph: "X"`, `ts`/`dur` in µs) for the phases, steps, saves, probes and every
collective; async begin/end pairs (`ph: "b"/"e"`) for point-to-point posts, which stay in flight
while their thread computes (complete events that overlap on one thread are dropped by Perfetto);
instants (`ph: "i"`) for marks such as a skipped step; metadata (`ph: "M"`) naming the process
(`pid` = the run's rank) and its threads. A collective's args carry Kineto's names (`Collective
name`, `In msg nelems`, `Out msg nelems`, `Group size`, `dtype`, `Process Group Ranks`, `Process
Group Name`) and ringzero's: algorithm, kind, bytes and messages each way, rounds, cross-node
bytes, its sequence number in its group and its wait for the last peer (µs, when known).
"""

from __future__ import annotations

from ringzero.plan.comm.volume import FIELDS

THREADS = (("MainThread", "compute"), ("ringzero-comm", "communication"), ("ringzero-nic", "link emulator (NIC)"),
           ("ringzero-checkpoint", "checkpoint writer"))
"""Known threads, by name prefix, in the order their rows are shown (tid = position + 1)."""


def thread_ids(names) -> dict[str, tuple[int, str]]:
    """Thread name -> (tid, shown name): the known threads first, any other after them."""
    out, extra = {}, len(THREADS) + 1
    for name in sorted(set(names)):
        known = next((i for i, (prefix, _) in enumerate(THREADS) if name.startswith(prefix)), None)
        if known is not None:
            out[name] = (known + 1, THREADS[known][1])
        else:
            out[name], extra = (extra, name), extra + 1
    return out


def us(t: float) -> float:
    """Seconds (`time.time()`) -> the trace's µs, rounded to the ns Kineto keeps."""
    return round(t * 1e6, 3)


def interval(start: float, end: float, shift=lambda t: t) -> dict:
    """A complete event's ts and dur (µs) for the span `start`..`end` (`time.time()` readings) on
    the clock `shift` maps to. Both ends are mapped and written as `us` writes a time, and dur is
    their difference, exact in floating point, so that ts + dur is the written end itself: a span
    nested in another on its rank's clock stays nested on the merged clock, whatever the offset
    does in between (`shift` never runs backwards) and however the figures round. (At today's epoch
    a double holds a µs figure to a quarter µs, not to the ns: a length kept apart from its start
    could round past its parent's end; mapping the start alone let a child outlast its parent by
    the offsets' drift between the two starts.)"""
    a, b = us(shift(start)), us(shift(end))
    return {"ts": a, "dur": b - a}


def traffic(counts: list[int] | None) -> dict[str, int]:
    return dict(zip(FIELDS, counts)) if counts else {}


def collective_args(c: dict, wait_s: float | None = None) -> dict:
    """A collective's args: Kineto's names, then ringzero's."""
    d, t = c.get("detail") or {}, traffic(c.get("counts"))
    args = {"Collective name": c["collective"], "In msg nelems": d.get("in_nelems", 0),
            "Out msg nelems": d.get("out_nelems", 0), "Group size": len(c["ranks"]), "dtype": d.get("dtype", ""),
            "Process Group Ranks": list(c["ranks"]), "Process Group Name": c["group"],
            "algorithm": c["algorithm"], "kind": c["kind"], "state": c["state"], "seq": c["seq"],
            "bytes sent": t.get("bytes_sent", 0), "bytes received": t.get("bytes_recv", 0),
            "messages sent": t.get("messages_sent", 0), "messages received": t.get("messages_recv", 0),
            "rounds": t.get("rounds", 0), "cross-node bytes sent": t.get("cross_node_bytes_sent", 0),
            "cross-node bytes received": t.get("cross_node_bytes_recv", 0)}
    if wait_s is not None:
        args["wait for last peer (us)"] = round(wait_s * 1e6, 3)
    return args


def rank_events(data: dict, shift=lambda t: t, waits: dict | None = None) -> list[dict]:
    """The trace events of one rank's `data` (`train.tracing.Tracer.data`); `shift` maps its clock
    to the one written (the merged trace's), `waits` a call's key -> its wait for the last peer."""
    pid, waits = data["rank"], waits or {}
    names = [s["thread"] for s in data["spans"]] + [c["thread"] for c in data["calls"] + data["p2p"]]
    tids = thread_ids(names or ["MainThread"])
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for name, (tid, shown) in sorted(tids.items(), key=lambda kv: kv[1]):
        out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": shown}},
                {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    for s in data["spans"]:
        ev = {"name": s["name"], "cat": s["cat"], "pid": pid, "tid": tids[s["thread"]][0], "args": dict(s["args"])}
        at = interval(s["start"], s["end"], shift)
        if s["end"] == s["start"] and s["cat"] == "mark":
            out.append({**ev, "ph": "i", "s": "t", "ts": at["ts"]})
        else:
            out.append({**ev, "ph": "X", **at})
    for c in data["calls"]:
        if c["end"] is None:
            continue
        key = call_key(c)
        out.append({"ph": "X", "name": c["collective"], "cat": "collective", "pid": pid, "tid": tids[c["thread"]][0],
                    **interval(c["start"], c["end"], shift), "args": collective_args(c, waits.get(key))})
    for i, c in enumerate(data["p2p"]):
        ev = {"name": "send/recv", "cat": "p2p", "pid": pid, "tid": tids[c["thread"]][0], "id": f"p2p-{pid}-{i}"}
        end = c["end"] if c["end"] is not None else c["start"]
        args = {"kind": c["kind"], "sends": c["detail"].get("sends", []), "recvs": c["detail"].get("recvs", []),
                "tag": c["detail"].get("tag"), **{k: v for k, v in traffic(c["counts"]).items() if v}}
        at = interval(c["start"], end, shift)
        out += [{**ev, "ph": "b", "ts": at["ts"], "args": args}, {**ev, "ph": "e", "ts": at["ts"] + at["dur"]}]
    return out


def call_key(c: dict) -> tuple:
    """A collective call's identity on every member rank: (group ranks, group name, sequence number)."""
    return tuple(c["ranks"]), c["group"], c["seq"]


def distributed_info(data: dict) -> dict:
    """Kineto's `distributedInfo`: backend, rank, world size and every process group with its ranks."""
    groups = data["groups"]
    return {"backend": data["backend"], "rank": data["rank"], "world_size": data["world"], "pg_count": len(groups),
            "pg_config": [{"pg_name": g["pg_name"], "pg_desc": g["name"], "backend_config": data["backend"],
                           "pg_size": len(g["ranks"]), "ranks": g["ranks"]} for g in groups]}
