"""The HTML report's charts, drawn by matplotlib as inline SVG strings from a run report's plain data.

Why matplotlib SVG and no chart library in the page: the page needs no script at all (nothing to
vendor, nothing that can fail to load offline), renders the same in every browser, and the
project already draws its plots with matplotlib. Text stays text (`svg.fonttype: none`), which keeps
the files small and the labels searchable.
"""

from __future__ import annotations

import io

import matplotlib
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

MEMORY = (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer states"),
          ("secondary", "hpZ secondary weights"), ("activations", "activations (one micro-batch)"))
"""The memory stacks, bottom to top: the `held` keys of a rank, then its activations."""
PREDICTED = {"params": "parameters held", "grads": "gradients held", "optimizer": "optimizer states held",
             "secondary": "hpZ secondary weights held", "activations": "activations saved (one micro-batch)"}
"""The twin row that predicts each stack (the busiest rank's)."""
BESIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
"""A legend to the right of its axes, where it hides no bar, label or axis (`svg` saves the figure
with its legend: bbox_inches="tight")."""


def svg(fig: Figure, chart_id: str) -> str:
    """`fig` as an inline <svg> element with id `chart_id` (the XML prologue dropped)."""
    buf = io.StringIO()
    FigureCanvasSVG(fig)
    # the same page from the same report: fixed element ids, no date
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": chart_id}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    return text.replace("<svg", f'<svg id="{chart_id}" role="img"', 1)


def losses(report: dict) -> str:
    """Training loss per step and the validation losses."""
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    first = report.get("first_step", 0)
    ax.plot([first + i + 1 for i in range(len(report["losses"]))], report["losses"], label="training (mean over ranks)")
    if report.get("val"):
        ax.plot([v["step"] for v in report["val"]], [v["loss"] for v in report["val"]], "o-", label="validation")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("loss")
    ax.legend(**BESIDE)
    ax.grid(alpha=0.3)
    return svg(fig, "chart-loss")


def _stacked(chart_id: str, labels: list[str], series: list[tuple[str, list[float]]], unit: str) -> str:
    """Bars over `labels`, one stack per label, one layer per (name, values) of `series` (empty
    layers left out)."""
    fig = Figure(figsize=(7, 3.3))
    ax = fig.add_subplot()
    bottom = [0.0] * len(labels)
    for name, values in series:
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel(unit)
    if any(any(v) for _, v in series):
        ax.legend(fontsize=8, **BESIDE)
    return svg(fig, chart_id)


def memory(report: dict) -> str:
    """Memory per rank, stacked, measured, beside the predicted stack of the busiest rank."""
    ranks = report["ranks"]
    series = []
    for key, name in MEMORY:
        twin = report["twins"].get(PREDICTED[key])
        measured = [(r.get("activations", 0) if key == "activations" else r["held"].get(key, 0)) for r in ranks]
        series.append((name, [v / 2**20 for v in [twin["predicted"] if twin else 0.0, *measured]]))
    return _stacked("chart-memory", ["predicted"] + [f"rank {r['rank']}" for r in ranks], series, "MiB")


def kinds(report: dict) -> str:
    """Bytes each rank sent in the measured step, stacked by communication kind."""
    ranks = report["ranks"]
    names = sorted({k for r in ranks for k in r.get("bytes_by_kind", {})})
    series = [(k, [r.get("bytes_by_kind", {}).get(k, {}).get("bytes_sent", 0) / 2**20 for r in ranks]) for k in names]
    return _stacked("chart-kinds", [f"rank {r['rank']}" for r in ranks], series, "MiB sent per step")


def gantt(merged: dict) -> str:
    """The traced steps' phases per rank on the merged clock (a merged trace's complete events), each
    step's start marked and labelled with its name (the first rank's, as the trace names it)."""
    fig = Figure(figsize=(9, 0.9 + 0.55 * max(1, merged["ringzero"]["world"])))
    ax = fig.add_subplot()
    events = [e for e in merged["traceEvents"] if e["ph"] == "X" and e.get("cat") in ("phase", "collective", "step")]
    t0 = min((e["ts"] for e in events), default=0.0)
    names = sorted({e["name"] for e in events if e["cat"] == "phase"})
    colours = {n: f"C{i % 10}" for i, n in enumerate(names)}
    ranks = sorted({e["pid"] for e in events})
    for e in events:
        y = ranks.index(e["pid"])
        start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
        if e["cat"] == "phase":
            ax.broken_barh([(start, width)], (y - 0.4, 0.5), color=colours[e["name"]])
        elif e["cat"] == "collective":     # a thin line under the phases
            ax.broken_barh([(start, width)], (y + 0.15, 0.2), color="black", alpha=0.5)
    for e in (e for e in events if e["cat"] == "step" and e["pid"] == ranks[0]):
        at = (e["ts"] - t0) / 1e3
        ax.axvline(at, color="grey", linewidth=0.6, linestyle=":")
        ax.text(at, 1.02, e["name"], transform=ax.get_xaxis_transform(), fontsize=7, ha="left", va="bottom")
    for n, c in colours.items():
        ax.bar(0, 0, color=c, label=n)
    ax.bar(0, 0, color="black", alpha=0.5, label="collectives")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms (merged clock)")
    ax.legend(fontsize=7, **BESIDE)
    return svg(fig, "chart-gantt")
