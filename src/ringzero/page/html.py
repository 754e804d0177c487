"""One self-contained HTML page of a run: its configuration, loss curves, the twin table with its
errors, memory per rank, bytes per rank by communication kind, the per-rank wait table and the
traced steps' timeline. No script, no link outside the file: the charts are inline SVG
(`page.charts`), the style one inline sheet.

`page(report, merged)` builds it from a run's JSON report (`twin.report.to_json`'s data, as
`ringzero train --json-report` writes it) and its merged trace (`ringzero train --trace DIR`'s
`DIR/merged.json`, or None); `write` writes it atomically. `ringzero train --html-report FILE.html`
and `ringzero analyze REPORT.json --html-report FILE.html` call it.
"""

from __future__ import annotations

import json
import os
from html import escape

from ringzero import outputs
from ringzero.page import charts

STYLE = """body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}h2{margin-top:1.6em}.note{color:#666;font-size:90%}
svg{max-width:100%;height:auto}details{margin:1em 0}"""


def merged_trace(folder: str | None) -> dict | None:
    """`folder`'s merged trace, loaded; None without one."""
    path = os.path.join(folder, "merged.json") if folder else None
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _table(table_id: str, head: list[str], rows: list[list]) -> str:
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>'


def _value(v, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "bytes":
        return f"{v:,.0f} B"
    if unit == "s":
        return f"{v * 1e3:.2f} ms"
    return f"{v:,.4g} {unit}"


def twin_rows(report: dict) -> list[list[str]]:
    """The twin table as the page shows it: name, predicted, measured, error."""
    return [[name, _value(t["predicted"], t["unit"]), _value(t["measured"], t["unit"]),
             "" if t["error"] is None else f"{t['error']:+.1%}"] for name, t in report["twins"].items()]


def _waits(report: dict) -> str:
    ranks = report["ranks"]
    kinds = sorted({k for r in ranks for k in r.get("waits_by_kind", {})})
    rows = [[r["rank"], f"{r['step_time'] * 1e3:.1f} ms", *[f"{r.get('waits_by_kind', {}).get(k, 0) * 1e3:.1f} ms" for k in kinds],
             f"{r['waiting_s'] * 1e3:.1f} ms" if "waiting_s" in r else ""] for r in ranks]
    return _table("waits", ["rank", "step", *[f"wait: {k}" for k in kinds], "waiting (all kinds)"], rows)


def page(report: dict, merged: dict | None) -> str:
    cfg = report["config"]
    title = f"ringzero: {cfg['model']} on {report['world']} ranks, {cfg['strategy']}"
    config_rows = [[k, json.dumps(v)] for k, v in cfg.items() if v is not None and v != () and v != [] and v != {}]
    timeline = charts.gantt(merged) if merged else \
        '<p id="no-timeline" class="note">The timeline needs a traced run: ringzero train ... --trace DIR.</p>'
    parts = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="note">{escape(report.get("error_definition", ""))}</p>',
        "<h2>Twins: predicted beside measured</h2>", _table("twins", ["", "predicted", "measured", "error"], twin_rows(report)),
        "<h2>Loss</h2>", charts.losses(report),
        "<h2>Memory per rank</h2>", charts.memory(report),
        "<h2>Bytes per rank by communication kind (measured step)</h2>", charts.kinds(report),
        "<h2>Waiting for the last peer, per rank and step</h2>", _waits(report),
        "<h2>Timeline of the traced steps</h2>", timeline,
        "<h2>Configuration</h2>", "<details open>" + _table("config", ["field", "value"], config_rows) + "</details>",
    ]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>" + "\n".join(parts) + "</body></html>")


def write(path: str, report: dict, merged: dict | None) -> None:
    outputs.write_text(path, page(report, merged))
