"""What a traced step spent its time on, per rank and for the job, and what holds it back.

`of_trace` reads a merged trace (`merge`), `of_report` a run's JSON report; both give the same
plain data, which `bottlenecks` reads:

- the temporal breakdown as Holistic Trace Analysis defines it (HTA's `get_temporal_breakdown`):
  per step, compute time (forward, backward, the optimizer, an injected straggler's sleep, less the
  collectives the computing thread blocks in), non-compute time (communication that no compute
  overlaps) and idle time (the rest of the step: neither), and HTA's communication/computation
  overlap ratio (`get_comm_comp_overlap`: time computing while communicating / time communicating);
- each rank's wait for its last peer in each collective kind (`comm.kinds`; the part of it that no
  compute of the rank hides, as the run report counts it: `twin.wait`), and its relative
  straggler score as nvidia-resiliency-ext's straggler detector scores ranks: the fastest rank's
  compute time over this rank's (1 = as fast as the fastest, 0.5 = twice as slow), compute here
  being forward, backward and an injected straggler's sleep (what a slower device stretches; the
  optimizer's fixed cost would dilute the score);
- the findings, each priced as the seconds per step it costs and ranked by that, the costliest
  named the bottleneck (`bottlenecks`; thresholds in `LIMITS`).

A report has no timeline, so `of_report` gives no overlap ratio (None); its breakdown is the
report's measured phases (exposed communication = the step outside forward, backward and the
optimizer, as the twin table's). torch-free: it reads plain data.
"""

from __future__ import annotations

from ringzero.trace.intervals import intersect, length, minus, union

COMPUTE = ("forward", "backward", "optimizer", "straggler")
"""The phases that compute (an injected straggler's sleep stands for a slower device's compute)."""
SCORED = ("forward", "backward", "straggler")
"""The compute a straggler score compares."""

LIMITS = {"straggler_score": 0.8, "bubble": 0.2, "exposed": 0.3, "optimizer": 0.3, "headroom": 0.1}
"""When a cost is named a bottleneck: a rank scoring below 0.8 (1.25x the fastest rank's
compute), a pipeline bubble above 20 % of the step, exposed communication above 30 %, the
optimizer (with its offload I/O) above 30 %, memory headroom below 10 % (a report only: the peak
memory of each rank against its device's, on the CPU the host's RAM its ranks share)."""


def _rank_of_trace(events: list[dict]) -> dict:
    """One rank's per-step breakdown from its events in a merged trace (times in µs)."""
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e.get("cat") == "step"]
    if not steps:
        raise ValueError("the trace holds no step (was it written by ringzero train --trace?)")
    phases = [e for e in events if e["ph"] == "X" and e.get("cat") == "phase"]
    compute_tids = {e["tid"] for e in phases}
    colls = [e for e in events if e["ph"] == "X" and e.get("cat") == "collective"]
    begins = {e["id"]: e for e in events if e["ph"] == "b" and e.get("cat") == "p2p"}
    p2p = [(begins[e["id"]]["ts"], e["ts"]) for e in events if e["ph"] == "e" and e["id"] in begins]
    comm = union([(e["ts"], e["ts"] + e["dur"]) for e in colls] + p2p)
    blocking = union([(e["ts"], e["ts"] + e["dur"]) for e in colls if e["tid"] in compute_tids]
                     + [(e["ts"], e["ts"] + e["dur"]) for e in phases if e["name"] == "comm"])
    compute = minus(union([(e["ts"], e["ts"] + e["dur"]) for e in phases if e["name"] in COMPUTE]), blocking)
    scored = minus(union([(e["ts"], e["ts"] + e["dur"]) for e in phases if e["name"] in SCORED]), blocking)
    window = union(steps)
    n = len(steps)
    within = lambda spans: length(_clip(spans, window))
    overlap = within(intersect(compute, comm))
    waiting: dict[str, list[tuple]] = {}      # [arrival, last peer's arrival] per call; calls overlap on threads
    for e in colls:
        w = e["args"].get("wait for last peer (us)")
        if w:
            waiting.setdefault(e["args"].get("kind", "other"), []).append((e["ts"], e["ts"] + w))
    hidden = lambda v: minus(union(v), compute)     # a wait while this rank still computes costs nothing
    waits = {k: within(hidden(v)) / 1e6 / n for k, v in waiting.items() if within(hidden(v))}
    norm = union([(e["ts"], e["ts"] + e["dur"]) for e in phases if e["name"] == "comm"])    # nested in the optimizer's
    spans = lambda names: minus(union([(e["ts"], e["ts"] + e["dur"]) for e in phases if e["name"] in names]), norm)
    phase = lambda name: within(spans((name,))) / 1e6 / n
    comm_s = within(comm) / 1e6 / n
    exposed_span = minus(window, union(spans(COMPUTE) + spans(("pipeline_wait",))))
    all_waits = hidden([s for v in waiting.values() for s in v])
    return {"step_s": length(window) / 1e6 / n, "compute_s": within(compute) / 1e6 / n,
            "scored_s": within(scored) / 1e6 / n,
            "non_compute_s": comm_s - overlap / 1e6 / n,
            "idle_s": (length(window) - within(union(compute + comm))) / 1e6 / n,
            "comm_s": comm_s, "overlap_ratio": overlap / within(comm) if within(comm) else None,
            "bubble_s": phase("pipeline_wait"), "optimizer_s": phase("optimizer"),
            "exposed_s": (length(window) - within(spans(COMPUTE))) / 1e6 / n
            - phase("pipeline_wait"), "waits_s": waits,
            "wait_s": within(all_waits) / 1e6 / n,
            "exposed_wait_s": length(intersect(all_waits, exposed_span)) / 1e6 / n, "steps": n}


def _clip(spans: list[tuple], window: list[tuple]) -> list[tuple]:
    return intersect(union(spans), window)


def of_trace(doc: dict) -> dict:
    """The analysis of a merged trace (`merge`'s file, loaded)."""
    by_rank: dict[int, list[dict]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] != "M":
            by_rank.setdefault(e["pid"], []).append(e)
    ranks = [{"rank": r, **_rank_of_trace(evs)} for r, evs in sorted(by_rank.items())]
    if not ranks:
        raise ValueError("the trace holds no step (was it written by ringzero train --trace?)")
    return _scored({"source": "trace", "world": doc["ringzero"]["world"], "ranks": ranks,
                    "pipeline": None, "config": doc["ringzero"].get("config")})


def of_report(report: dict) -> dict:
    """The analysis of a run's JSON report (`ringzero train --json-report`)."""
    ranks = []
    for r in report["ranks"]:
        ph = r["phases"]
        compute = sum(ph.get(k, 0.0) for k in COMPUTE)
        exposed = max(0.0, r["step_time"] - compute - ph.get("pipeline_wait", 0.0))
        wait = r.get("waiting_s", sum(r.get("waits_by_kind", {}).values()))
        ranks.append({"rank": r["rank"], "step_s": r["step_time"], "compute_s": compute,
                      "scored_s": sum(ph.get(k, 0.0) for k in SCORED), "non_compute_s": exposed,
                      "idle_s": ph.get("pipeline_wait", 0.0), "comm_s": None, "overlap_ratio": None,
                      "bubble_s": ph.get("pipeline_wait", 0.0), "optimizer_s": ph.get("optimizer", 0.0),
                      "exposed_s": exposed, "waits_s": r.get("waits_by_kind", {}),
                      "wait_s": wait, "exposed_wait_s": r.get("comm_waiting_s", wait), "steps": None})
    return _scored({"source": "report", "world": report["world"], "ranks": ranks,
                    "pipeline": report.get("pipeline"), "config": report.get("config"),
                    "memory": headroom([r.get("memory") or {} for r in report["ranks"]])})


def headroom(memory: list[dict]) -> list[dict]:
    """Per device (a GPU; on the CPU a host, whose ranks share its RAM): {"where", "peak_bytes",
    "capacity_bytes", "headroom"}, the capacity its ranks' peaks leave free, as a share."""
    out: dict[str, dict] = {}
    for i, m in enumerate(memory):
        if not m:
            continue
        where = f"host {m['host']}" if m["device"] == "cpu" else f"rank {i}'s GPU on {m['host']}"
        d = out.setdefault(where, {"where": where, "peak_bytes": 0, "capacity_bytes": m["capacity_bytes"]})
        d["peak_bytes"] += m["peak_bytes"]
    for d in out.values():
        d["headroom"] = 1 - d["peak_bytes"] / d["capacity_bytes"] if d["capacity_bytes"] else 0.0
    return list(out.values())


def _scored(a: dict) -> dict:
    fastest = min(r["scored_s"] for r in a["ranks"])
    for r in a["ranks"]:
        r["score"] = fastest / r["scored_s"] if r["scored_s"] else 1.0
    return {**a, "bottlenecks": bottlenecks(a)}


def bottlenecks(a: dict) -> list[dict]:
    """Every cost above its limit (`LIMITS`), the costliest first: {"name", "cost_s", "share", "why"}.

    Every finding is priced the same way, so that they rank against each other: "cost_s" is its
    seconds per step on the rank where it is largest, "share" that over the slowest rank's step.
    One slow rank costs the others' wait for it; exposed communication the exposed time less that
    wait (a wait in a collective is exposed time on the waiting rank: counted once, as the slow
    rank's); the bubble and the optimizer their time. Memory headroom costs no step time (cost 0):
    it is a limit on a larger batch or model, listed last."""
    ranks = a["ranks"]
    step = max(r["step_s"] for r in ranks)
    out = []
    slow = min(ranks, key=lambda r: r["score"])
    waiting = {r["rank"]: (0.0, 0.0) for r in ranks}
    if len(ranks) > 1 and slow["score"] < LIMITS["straggler_score"]:
        waiting = _waiting_for(slow, ranks)
        wait = max(w for w, _ in waiting.values())
        out.append({"name": "one slow rank", "cost_s": wait, "rank": slow["rank"],
                    "why": f"rank {slow['rank']} scores {slow['score']:.2f} (its compute {1 / slow['score']:.2f}x the "
                           f"fastest rank's); the others wait up to {wait * 1e3:.1f} ms per step for it"})
    bubble = max(r["bubble_s"] for r in ranks)
    if bubble / step > LIMITS["bubble"]:
        m = (a.get("config") or {}).get("grad_accum")
        out.append({"name": "pipeline bubble", "cost_s": bubble,
                    "why": f"stages idle {bubble / step:.0%} of the step waiting for their neighbours"
                           + (f" (m = {m} micro-batches per step)" if m else "")})
    exposed = max(max(0.0, r["exposed_s"] - waiting[r["rank"]][1]) for r in ranks)
    if exposed / step > LIMITS["exposed"]:
        besides = " besides waiting for the slow rank" if any(w for _, w in waiting.values()) else ""
        out.append({"name": "exposed communication", "cost_s": exposed,
                    "why": f"{exposed / step:.0%} of the step is communication that compute does not hide{besides}"})
    opt = max(r["optimizer_s"] for r in ranks)
    if opt / step > LIMITS["optimizer"]:
        out.append({"name": "optimizer and offload I/O", "cost_s": opt,
                    "why": f"the optimizer step takes {opt / step:.0%} of the step"})
    for m in a.get("memory") or []:
        if m["headroom"] < LIMITS["headroom"]:
            out.append({"name": "memory headroom", "cost_s": 0.0,
                        "why": f"{m['where']} has {m['headroom']:.0%} of its memory left at the peak "
                               f"({m['peak_bytes'] / 2**30:.2f} of {m['capacity_bytes'] / 2**30:.2f} GiB)"})
    return sorted(({**b, "share": b["cost_s"] / step} for b in out), key=lambda b: -b["cost_s"])


def _waiting_for(slow: dict, ranks: list[dict]) -> dict[int, tuple[float, float]]:
    """Per rank, (seconds per step it waits for the `slow` rank, the part of them in its exposed
    communication): the measured waits for the last peer, or, where none was measured (a pipeline's
    report), what its exposed communication exceeds the slow rank's by."""
    others = [r for r in ranks if r is not slow]
    if any(r["wait_s"] for r in others):
        return {r["rank"]: (0.0, 0.0) if r is slow else (max(r["wait_s"], 0.0), max(r["exposed_wait_s"], 0.0))
                for r in ranks}
    return {r["rank"]: (max(0.0, r["exposed_s"] - slow["exposed_s"]),) * 2 for r in ranks}
