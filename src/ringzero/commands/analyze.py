"""`ringzero analyze PATH`: what a run spent its steps on, per rank and for the job, and its bottleneck.

    ringzero analyze traces/                  # a `ringzero train --trace` folder (its merged.json)
    ringzero analyze traces/rank1.json        # one rank's trace
    ringzero analyze report.json              # a `ringzero train --json-report` report
    ringzero analyze stall.json               # a hung job's flight recorder dumps: torch's verdict line

Bad input (a missing path, a file that is neither a ringzero report, trace nor flight dump, a trace
or report of another schema) is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os

from ringzero.commands import analyze_try
from ringzero.errors import UsageError

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="DIR|FILE.json",
                   help="a trace folder or file (ringzero train --trace), a report (--json-report) or a flight dump")
    p.add_argument("--json", action="store_true", help="print the analysis as JSON")
    p.add_argument("--html-report", metavar="FILE.html",
                   help="write a report's run as one self-contained page (as ringzero train --html-report does)")
    p.add_argument("--try-best", action="store_true",
                   help="run a report's run as it was and with the top suggestion (same seed and steps), in turns, "
                        "and print the measured gain beside the predicted one")
    p.add_argument("--try-rounds", type=int, default=analyze_try.ROUNDS, metavar="N",
                   help=f"--try-best's runs of each, the run as it was and changed (default {analyze_try.ROUNDS})")


def load(path: str) -> tuple[str, dict]:
    """(what it is: "trace", "report" or "flight", the loaded document), or a UsageError naming why not."""
    if not os.path.exists(path):
        raise UsageError(f"analyze: {path} does not exist (give a trace folder, a trace, a report or a flight dump)")
    if os.path.isdir(path):
        merged = os.path.join(path, "merged.json")
        if not os.path.isfile(merged):
            raise UsageError(f"analyze: {path} is a folder without merged.json: not a ringzero trace folder")
        path = merged
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"analyze: {path} is not a ringzero report, trace or flight dump (not JSON: {exc})") from None
    return _kind(path, doc), doc


def _kind(path: str, doc) -> str:
    if isinstance(doc, dict) and "traceEvents" in doc:
        meta = doc.get("ringzero")
        if not isinstance(meta, dict):
            raise UsageError(f"analyze: {path} is a trace, but not one ringzero wrote (it has no \"ringzero\" section)")
        from ringzero.trace.write import SCHEMA
        if meta.get("schema") != SCHEMA:
            raise UsageError(f"analyze: {path} is a ringzero trace of schema {meta.get('schema')!r}; "
                             f"this ringzero reads schema {SCHEMA}")
        return "trace"
    if isinstance(doc, dict) and "twins" in doc and "schema" in doc:
        from ringzero.twin.report import SCHEMA
        if doc["schema"] != SCHEMA:
            raise UsageError(f"analyze: {path} is a report of schema {doc['schema']!r}; this ringzero reads {SCHEMA}")
        if not all("phases" in r for r in doc.get("ranks", [])) or not doc.get("ranks"):
            raise UsageError(f"analyze: {path} is a parameter-server report: analyze reads grid runs' reports and traces")
        return "report"
    if isinstance(doc, dict) and doc and all(str(k).isdigit() and isinstance(v, dict) and "entries" in v
                                             for k, v in doc.items()):
        return "flight"
    keys = ", ".join(list(doc)[:5]) if isinstance(doc, dict) else type(doc).__name__
    raise UsageError(f"analyze: {path} is not a ringzero report, trace or flight dump (it holds {keys})")


def run(args: argparse.Namespace) -> int:
    if args.try_rounds < 1:
        raise UsageError(f"analyze --try-rounds {args.try_rounds}: give 1 or more runs of each")
    kind, doc = load(args.path)
    if kind == "flight":
        from ringzero.comm import flight_analysis
        path = os.path.join(args.path, "merged.json") if os.path.isdir(args.path) else args.path
        try:
            line = flight_analysis.verdict(flight_analysis.load(path))
        except ValueError as exc:
            raise UsageError(f"analyze: {exc}") from None
        print(json.dumps({"verdict": line}) if args.json else line)
        return 0
    if args.html_report:
        _check_page(args.html_report, kind, args.path)
    if args.try_best and (kind != "report" or not doc.get("argv")):
        raise UsageError(f"analyze --try-best: {args.path} is not a report with its command line (give one that "
                         "ringzero train --json-report wrote)")
    from ringzero.trace import analysis
    try:
        result = analysis.of_trace(doc) if kind == "trace" else analysis.of_report(doc)
    except (ValueError, KeyError, TypeError) as exc:      # the right schema, but not what ringzero writes in it
        raise UsageError(f"analyze: {args.path}: cannot read it as a ringzero {kind}: {exc}") from None
    if kind == "report" and all("buckets" in r for r in doc["ranks"]):
        from ringzero.twin import suggest
        result["suggestions"] = suggest.ranked(doc)
    if args.html_report:
        from ringzero.page import html
        html.write(args.html_report, doc, html.merged_trace((doc.get("config") or {}).get("trace")))
    if args.json and not args.try_best:
        print(json.dumps(result, indent=1))
        return 0
    if not args.json:
        render(result)
    if args.try_best:
        measured = analyze_try.try_best(doc, result["suggestions"], args.try_rounds)
        print(json.dumps({**result, "try_best": measured}, indent=1) if args.json else measured["line"])
    return 0


def _check_page(path: str, kind: str, source: str) -> None:
    from ringzero import outputs
    if kind != "report":
        raise UsageError(f"analyze --html-report: {source} is a {kind}; the page is drawn from a report "
                         "(ringzero train --json-report)")
    outputs.check(path, "--html-report")
    if not path.endswith((".html", ".htm")):
        raise UsageError(f"analyze --html-report {path!r}: give a FILE.html")


def _ms(v) -> str:
    return "" if v is None else f"{v * 1e3:.1f}"


def render(a: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console()
    source = "the traced steps" if a["source"] == "trace" else "the report's medians of steady steps"
    table = Table(title=f"time per step in ms ({source})")
    for col in ("rank", "step", "compute", "non-compute", "idle", "overlap", "bubble", "optimizer"):
        table.add_column(col, justify="right")
    for r in a["ranks"]:
        table.add_row(str(r["rank"]), _ms(r["step_s"]), _ms(r["compute_s"]), _ms(r["non_compute_s"]), _ms(r["idle_s"]),
                      "" if r["overlap_ratio"] is None else f"{r['overlap_ratio']:.2f}", _ms(r["bubble_s"]),
                      _ms(r["optimizer_s"]))
    console.print(table)
    console.print("as Holistic Trace Analysis breaks a step down: compute, non-compute (communication that no "
                  "compute hides), idle (neither); overlap = time computing while communicating / time communicating")
    kinds = sorted({k for r in a["ranks"] for k in r["waits_s"]})
    stragglers = Table(title="stragglers: wait for the last peer per step (ms)")
    for col in ("rank", *kinds, "score"):
        stragglers.add_column(col, justify="right")
    for r in a["ranks"]:
        stragglers.add_row(str(r["rank"]), *[_ms(r["waits_s"].get(k, 0.0)) for k in kinds], f"{r['score']:.2f}")
    console.print(stragglers)
    console.print("by communication kind; score = the fastest rank's compute (forward, backward) / this rank's "
                  "(nvidia-resiliency-ext's relative score: 0.5 = twice as slow)")
    for m in a.get("memory") or []:
        console.print(f"memory: {m['where']}: peak {m['peak_bytes'] / 2**30:.2f} of {m['capacity_bytes'] / 2**30:.2f} GiB "
                      f"({m['headroom']:.0%} left)")
    if a["source"] == "report":
        console.print("overlap: needs a trace (ringzero train --trace DIR); a report holds no timeline")
    found = a["bottlenecks"]                 # the costliest first (`analysis.bottlenecks`)
    if not found or not found[0]["cost_s"]:
        step = max(r["step_s"] for r in a["ranks"])
        compute = max(r["compute_s"] for r in a["ranks"])
        console.print(f"bottleneck: none above the limits; compute is {compute / step:.0%} of the step")
    for i, b in enumerate(found):
        cost = f"{b['share']:.0%} of the step, {b['cost_s'] * 1e3:.1f} ms" if b["cost_s"] else "costs no step time"
        console.print(f"{'bottleneck' if i == 0 and b['cost_s'] else 'also'}: {b['name']} ({cost}): {b['why']}")
    if a.get("suggestions"):
        _suggestions(console, a["suggestions"])


def _suggestions(console, rows: list[dict]) -> None:
    from rich.table import Table
    table = Table(title="suggestions, ranked by the planner's predicted gain in tokens per second")
    for col in ("change", "step", "tokens/s", "gain", "memory/rank"):
        table.add_column(col, justify="left" if col == "change" else "right")
    for s in rows:
        table.add_row(" ".join(s["flags"]) or "(this run)", f"{s['step_s'] * 1e3:.1f} ms", f"{s['tokens_per_s']:,.0f}",
                      f"{s['gain']:.2f}x", f"{s['memory_bytes'] / 2**20:.1f} MiB")
    console.print(table)
    if len(rows) > 1:
        console.print(f"best: {rows[1]['why']} (ringzero analyze REPORT.json --try-best runs it)")
