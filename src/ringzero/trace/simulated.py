"""A simulated step as a trace in `ringzero train --trace`'s format, so that a step played on a
modelled cluster and a measured one open side by side (Perfetto, chrome://tracing) and
`ringzero analyze` reads both.

One process per pipeline stage (pid: the GPU of its first tp rank in its first dp replica, the
replica the job follows), its compute stream on tid 1 (the engine's main thread: phases forward,
backward, pipeline_wait, optimizer, offload, with the blocking tp collectives nested in them), the
data-parallel stream on tid 2 (the engine's communication thread) and the point-to-point sends as
async b/e pairs from the producer's end to the message's arrival. Every stage's step lasts the
job's step: a stage done before the slowest idles until it ends (pipeline_wait), as it would in
the steady state of a run, where that idle is its share of the bubble. Spans are plain data (lane,
name, start, end, kind) in seconds from the step's start.
"""

from __future__ import annotations

from ringzero.trace.write import SCHEMA, document

PHASES = ("forward", "backward", "pipeline_wait", "optimizer", "offload")
TIDS = {"compute": 1, "comm": 2, "p2p": 2}
NAMES = {1: "compute", 2: "communication"}


def _at(start: float, end: float) -> dict:
    """ts and dur in µs from whole ns, so that spans which touch in the simulation touch in the
    file (rounding each figure alone can make one end a nanosecond past the next start)."""
    a, b = round(start * 1e9), round(end * 1e9)
    return {"ts": a / 1e3, "dur": (b - a) / 1e3}


def _meta(pid: int, stage: int) -> list[dict]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"stage {stage} (GPU {pid})"}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": stage}}]
    for tid, name in NAMES.items():
        out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
                {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    return out


def _collective(span, pid: int, group: int) -> dict:
    args = {"Collective name": span.name, "Group size": group, "kind": span.kind, "simulated": True}
    return {"ph": "X", "name": span.name, "cat": "collective", "pid": pid, "tid": TIDS[span.lane],
            **_at(span.start, span.end), "args": args}


def events(stages: list, pids: list[int], group: dict[str, int], seconds: float) -> list[dict]:
    """Every stage's spans (`stages[s]`: objects with lane, name, start, end, kind) as trace events;
    `group`: kind -> its group size, for the collectives' args."""
    out = []
    for s, (spans, pid) in enumerate(zip(stages, pids)):
        out += _meta(pid, s)
        out.append({"ph": "X", "name": "step 1", "cat": "step", "pid": pid, "tid": 1, **_at(0.0, seconds),
                    "args": {"step": 1}})
        done = max((sp.end for sp in spans if sp.lane != "p2p"), default=0.0)
        if done < seconds:       # a stage done early idles until the step ends: the pipeline's bubble
            out.append({"ph": "X", "name": "pipeline_wait", "cat": "phase", "pid": pid, "tid": 1,
                        **_at(done, seconds), "args": {"after": "this stage's step"}})
        for i, sp in enumerate(spans):
            if sp.lane == "p2p":
                ev = {"name": sp.name, "cat": "p2p", "pid": pid, "tid": 2, "id": f"p2p-{pid}-{i}"}
                at = _at(sp.start, sp.end)
                out += [{**ev, "ph": "b", "ts": at["ts"], "args": {"kind": "pp"}},
                        {**ev, "ph": "e", "ts": at["ts"] + at["dur"]}]
            elif sp.lane == "compute" and sp.name in PHASES:
                out.append({"ph": "X", "name": sp.name, "cat": "phase", "pid": pid, "tid": 1,
                            **_at(sp.start, sp.end), "args": {}})
            else:
                out.append(_collective(sp, pid, group.get(sp.kind, 1)))
    return out


def simulated_trace(stages: list, pids: list[int], group: dict[str, int], seconds: float, world: int,
                    config: dict) -> dict:
    """The whole trace document: `events` with the distributed info and ringzero's section."""
    info = {"backend": "simulated", "rank": 0, "world_size": world, "pg_config": []}
    meta = {"kind": "simulated", "schema": SCHEMA, "world": world, "config": config,
            "steps": [{"step": 1, "seconds": seconds}]}
    return document(events(stages, pids, group, seconds), info, meta)
