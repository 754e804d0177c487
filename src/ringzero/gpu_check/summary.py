"""The GPU check's summary: each finished part's status and numbers, read from its report or output.

A part passed when its command exited 0 and its numbers could be read (and, for the tests, when at
least one CUDA test ran rather than skipped); otherwise it failed, or timed out, and keeps the tail
of its output. Every part also counts the "NCCL INFO" lines of its output (`nccl_log_lines`): the
check runs with NCCL_DEBUG=INFO, so 0 means the part never built an NCCL communicator.
"""

from __future__ import annotations

import json
import re
import statistics

from ringzero.gpu_check.parts import Finished, Part

SCHEMA = "ringzero.gpu-check/1"
PEER = "torch"
"""The algorithm name of the backend's own collective in ringzero's rows."""

_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def nccl_log_lines(text: str) -> int:
    return sum("NCCL INFO" in line for line in text.splitlines())


def pytest_numbers(finished: Finished, _part: Part) -> dict:
    """{"passed": n, "skipped": n, ...} from pytest's last summary line."""
    lines = [ln for ln in finished.stdout.splitlines() if _COUNTS.search(ln) and " in " in ln]
    if not lines:
        raise ValueError("pytest printed no summary line")
    counts = {word.rstrip("s") if word.startswith("error") else word: int(n)
              for n, word in _COUNTS.findall(lines[-1])}
    if not counts.get("passed"):
        raise ValueError(f"no CUDA test passed ({lines[-1].strip(' =')})")
    return counts


def train_numbers(_finished: Finished, part: Part) -> dict:
    """The layout, the last validation loss and every twin of a `ringzero train --json-report`."""
    data = _load(part.report)
    cfg = data["config"]
    twins = {name: {k: t[k] for k in ("predicted", "measured", "error", "unit")}
             for name, t in data["twins"].items()}
    known = {name: t["error"] for name, t in twins.items() if t["error"] is not None}
    worst = max(known, key=lambda name: abs(known[name])) if known else None
    return {"world": data["world"], "strategy": cfg["strategy"], "tp": cfg["tp"], "pp": cfg["pp"],
            "steps": cfg["steps"], "val_loss": data["val"][-1]["loss"] if data["val"] else None,
            "twins": twins, "worst_twin": None if worst is None else {"name": worst, "error": known[worst]}}


def comm_rows(rows: list[dict]) -> list[dict]:
    """Each row's essentials, with its time against the backend's own collective of the same cell
    (`vs_peer` = time / the peer's time: below 1 is faster than the backend)."""
    peer = {(r["collective"], r["size"]): r["time_us"] for r in rows
            if r["algorithm"] == PEER and r.get("time_us")}
    out = []
    for r in rows:
        base = peer.get((r["collective"], r["size"]))
        t = r.get("time_us")
        out.append({"collective": r["collective"], "algorithm": r["algorithm"], "world": r["world"],
                    "size": r["size"], "time_us": t, "busbw": r.get("busbw"), "wrong": r.get("wrong"),
                    "error": r.get("error"), "vs_peer": t / base if t and base else None})
    return out


def bench_comm_numbers(finished: Finished, _part: Part) -> dict:
    """`ringzero bench comm --json`'s rows; `wrong` is their elements that differ from the exact result."""
    rows = comm_rows(json.loads(finished.stdout)["rows"])
    return {"rows": rows, "wrong": sum(r["wrong"] or 0 for r in rows)}


def nccl_comm_numbers(_finished: Finished, part: Part) -> dict:
    """`gpu_check.nccl_comm`'s report: its backend and device, rows against NCCL's own collective,
    the algorithms that failed, and whether the metadata handshake (`comm.check`) ran."""
    data = _load(part.report)
    rows = comm_rows(data["rows"])
    if not data.get("complete"):
        raise ValueError(f"the report stops after {len(rows)} rows")
    ratios = [r["vs_peer"] for r in rows if r["algorithm"] != PEER and r["vs_peer"]]
    failed = sorted({f"{r['collective']}/{r['algorithm']}" for r in rows if r["error"] or r["wrong"]})
    return {"backend": data["backend"], "device": data["device"], "world": data["world"],
            "rows": rows, "failed": failed, "wrong": sum(r["wrong"] or 0 for r in rows),
            "median_vs_peer": statistics.median(ratios) if ratios else None, "checks": data["checks"]}


READERS = {"pytest": pytest_numbers, "train": train_numbers, "bench_comm": bench_comm_numbers,
           "nccl_comm": nccl_comm_numbers}


def _load(path: str | None) -> dict:
    if path is None:
        raise ValueError("the part names no report")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no report at {path}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def entry(part: Part, finished: Finished) -> dict:
    """One part's line of the summary."""
    out = {"name": part.name, "kind": part.kind, "status": "passed", "rc": finished.rc,
           "wall_s": round(finished.wall_s, 2), "timeout_s": part.timeout_s, "command": list(part.argv),
           "nccl_log_lines": nccl_log_lines(finished.stdout + "\n" + finished.stderr)}
    if part.note:
        out["note"] = part.note
    if finished.timed_out:
        out["status"] = "timeout"
    elif finished.rc != 0:
        out["status"] = "failed"
    try:
        out["numbers"] = READERS[part.kind](finished, part)
    except (ValueError, KeyError, TypeError, IndexError, OSError) as exc:   # json errors are ValueErrors
        out["numbers_error"] = _first_line(exc)
        if out["status"] == "passed":
            out["status"] = "failed"
    if out["status"] != "passed":
        out["tail"] = finished.tail()
    return out


def assemble(machine: dict, entries: list[dict], wall_s: float, done: bool) -> dict:
    """The whole summary: the machine, every part run so far, and the verdict."""
    counts = {s: sum(e["status"] == s for e in entries) for s in ("passed", "failed", "timeout")}
    return {"schema": SCHEMA, "machine": machine, "complete": done, "wall_s": round(wall_s, 2),
            "ok": done and counts["failed"] == counts["timeout"] == 0, "counts": counts, "parts": entries}
