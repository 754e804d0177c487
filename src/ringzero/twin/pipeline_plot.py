"""A picture of one measured pipeline step, drawn like the schedule figures of GPipe (Huang et al.
2019, Fig. 2) and Megatron-LM (Narayanan et al. 2021, Figs. 3 and 4).

One row per stage, stage 0 at the top, time in milliseconds from the step's first start. Every
forward or backward is a bar coloured by its micro-batch (one hue per micro-batch, the backward a
darker shade of it), with the micro-batch number written inside when the bar is wide enough; a
chunk other than 0 of an interleaved stage is hatched. The row's light grey background shows where
the stage sat idle: that grey is the bubble.
"""

from __future__ import annotations

import os

import matplotlib
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ringzero.outputs import write_with

_WIDTH_IN = 10.0          # figure width; the height grows with the stages
_ROW_IN = 0.45
_DPI = 120
_DARKEN = 0.6             # backward = forward colour x this
_LABEL_PX = 14            # narrowest bar (pixels) that still gets its micro-batch number


def _colour(micro: int, kind: str) -> tuple[float, float, float]:
    palette = matplotlib.colormaps["tab10"].colors      # qualitative: neighbours never look alike
    rgb = to_rgb(palette[micro % len(palette)])
    return tuple(c * _DARKEN for c in rgb) if kind == "B" else rgb


def _check(timeline: list[list[dict]]) -> None:
    if not timeline or not any(timeline):
        raise ValueError("timeline has no events: expected one list of events per stage")
    for i, events in enumerate(timeline):
        for e in events:
            if e.get("kind") not in ("F", "B"):
                raise ValueError(f"stage {i}: event kind must be 'F' or 'B', got {e.get('kind')!r}")
            if e["end"] < e["start"]:
                raise ValueError(f"stage {i}: event {e} ends before it starts")


def _title(title: str, bubble: float | None, predicted: float | None) -> str:
    parts = []
    if bubble is not None:
        parts.append(f"measured {100 * bubble:.1f} %")
    if predicted is not None:
        parts.append(f"planner {100 * predicted:.1f} %")
    sub = "idle fraction " + ", ".join(parts) if parts else ""
    return "\n".join(s for s in (title, sub) if s)


def _draw(timeline: list[list[dict]], title: str, bubble: float | None, predicted: float | None) -> Figure:
    p = len(timeline)
    t0 = min(e["start"] for events in timeline for e in events)
    span_ms = max(1e3 * (e["end"] - t0) for events in timeline for e in events) or 1.0
    fig = Figure(figsize=(_WIDTH_IN, 1.6 + _ROW_IN * p), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    # The axes are about 85 % of the figure wide: enough to decide which bars can hold a number.
    px_per_ms = 0.85 * _WIDTH_IN * _DPI / span_ms
    chunked = False
    for i, events in enumerate(timeline):
        ax.barh(i, span_ms, left=0, height=0.8, color="0.92", zorder=0)
        for e in events:
            left, width = 1e3 * (e["start"] - t0), 1e3 * (e["end"] - e["start"])
            rgb = _colour(e["micro"], e["kind"])
            chunked |= e.get("chunk", 0) > 0
            ax.barh(i, width, left=left, height=0.8, color=rgb, edgecolor="0.15", linewidth=0.5,
                    hatch="//" if e.get("chunk", 0) > 0 else None, zorder=1)
            if width * px_per_ms >= _LABEL_PX * len(str(e["micro"])):
                # Rec. 601 luma: white text on dark fills, black on light ones.
                dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.5
                # On a hatched bar the number sits on a patch of the fill so the hatch does not cross it.
                box = dict(facecolor=rgb, edgecolor="none", pad=0.6) if e.get("chunk", 0) > 0 else None
                ax.text(left + width / 2, i, str(e["micro"]), ha="center", va="center", fontsize=8,
                        color="white" if dark else "black", bbox=box, zorder=2)
    ax.set_xlim(0, span_ms)
    ax.set_ylim(p - 0.5, -0.5)                            # stage 0 at the top
    ax.set_yticks(range(p), [f"stage {i}" for i in range(p)])
    ax.set_xlabel("time (ms)")
    ax.set_title(_title(title, bubble, predicted))
    handles = [Patch(facecolor="0.75", edgecolor="0.15", label="forward"),
               Patch(facecolor=(0.45, 0.45, 0.45), edgecolor="0.15", label="backward")]
    if chunked:
        handles.append(Patch(facecolor="white", edgecolor="0.15", hatch="//", label="chunk ≥ 1"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return fig


def plot(timeline: list[list[dict]], path: str, title: str = "", bubble: float | None = None,
         predicted: float | None = None) -> None:
    """Draw one pipeline step to `path` (a PNG, or any format matplotlib knows by its extension).

    `timeline[i]` is stage i's events, each {"kind": "F" or "B", "micro": int, "chunk": int,
    "start": s, "end": s} on one clock shared by all stages. `title` names the schedule; `bubble`
    (the measured idle fraction) and `predicted` (the planner's) go in a subtitle. The figure is
    built without pyplot (no display, nothing left in a global figure list) and written as every
    output is (`outputs.write_with`: a synced temporary file beside `path` renamed onto it, with an
    ordinary file's mode), so a reader never sees half a file.
    """
    _check(timeline)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write the pipeline plot to {path!r}: folder {folder!r} does not exist")
    fig = _draw(timeline, title, bubble, predicted)
    fmt = os.path.splitext(path)[1][1:] or "png"
    write_with(path, lambda f: fig.savefig(f, dpi=_DPI, format=fmt), binary=True)
