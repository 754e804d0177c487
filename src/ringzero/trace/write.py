"""Writing a run's traces: `DIR/ranks/rank<R>.json` for every rank and `DIR/merged.json`, each
atomically (`ringzero.outputs`: a reader never sees half a file).

Why the rank files have a folder of their own: Holistic Trace Analysis, like TensorBoard's profiler
plugin, reads every `.json` of the folder it is given as one rank's trace, that rank read from the
file's first `"rank": N` (0 when it finds none), so a merged file among them would be taken for
rank 0 and every rank's events read as its own. `DIR/ranks/` holds this run's rank files and
nothing else (a rank file of an earlier, wider run there is removed); `merged.json` stays where
`ringzero analyze DIR` and the HTML report read it.
"""

from __future__ import annotations

import json
import os
import re

from ringzero import outputs
from ringzero.trace import merge
from ringzero.trace.events import distributed_info, rank_events

SCHEMA = 1
"""The version of ringzero's part of a trace file (`"ringzero"` in its top level)."""


def _summary(data: dict) -> dict:
    """What a rank's file says besides its events: the traced steps with the engine's phase times,
    the traffic meter's totals over them and the clock anchors."""
    return {"schema": SCHEMA, "rank": data["rank"], "world": data["world"], "global_rank": data["global_rank"],
            "steps": data["steps"], "meter": data["meter"], "clock": data["clock"]}


def document(events: list[dict], info: dict, ringzero: dict) -> dict:
    return {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": info, "displayTimeUnit": "ms",
            "traceEvents": events, "ringzero": ringzero}


RANKS = "ranks"
"""The folder of the rank files, under the trace folder."""
_RANK_FILE = re.compile(r"rank\d+\.json")


def write_traces(folder: str, datas: list[dict]) -> list[str]:
    """Write every rank's trace and the merged one under `folder` (made if missing); returns the paths."""
    os.makedirs(os.path.join(folder, RANKS), exist_ok=True)
    datas = sorted(datas, key=lambda d: d["rank"])
    written = {f"rank{d['rank']}.json" for d in datas}
    for name in os.listdir(os.path.join(folder, RANKS)):
        if _RANK_FILE.fullmatch(name) and name not in written:
            os.remove(os.path.join(folder, RANKS, name))
    waited = merge.waits(datas)
    paths, merged, by_rank = [], [], {}
    for d in datas:
        mine = waited.get(d["rank"], {})
        events = rank_events(d, waits=mine)
        path = os.path.join(folder, RANKS, f"rank{d['rank']}.json")
        outputs.write_text(path, json.dumps(document(events, distributed_info(d), {"kind": "rank", **_summary(d)})))
        paths.append(path)
        by_rank[d["rank"]] = rank_events(d, merge.shift_of(d), mine)
        merged += by_rank[d["rank"]]
    merged += merge.flows(by_rank)
    meta = {"kind": "merged", "schema": SCHEMA, "world": datas[0]["world"], "config": datas[0].get("config"),
            "clock": merge.alignment(datas),
            "ranks": [_summary(d) for d in datas]}
    path = os.path.join(folder, "merged.json")
    outputs.write_text(path, json.dumps(document(merged, distributed_info(datas[0]), meta)))
    return paths + [path]

