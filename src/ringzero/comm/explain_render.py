"""Output of `ringzero explain`: the rich walk-through for people and the plain data of `--json`.

Pure formatting of an `Explanation` (`ringzero.comm.explanation`, built by `ringzero.comm.explain`).
"""

from __future__ import annotations

import dataclasses

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ringzero.plan.comm.algorithms import NODE_AWARE
from ringzero.plan.comm.volume import ROOTED, Volume
from ringzero.comm.explanation import ITEMSIZE, Explanation
from ringzero.comm.symbolic_values import fmt, letter

SOURCES = {
    "ring": "Patarasuk & Yuan 2009", "rabenseifner": "Rabenseifner 2004",
    "recursive_halving": "Thakur, Rabenseifner & Gropp 2005", "hierarchical": "Jia et al. 2018",
    "hierarchical_2d": "Mikami et al. 2018",
    "scatter_allgather": "Barnett et al. 1994",
}
"""Where an algorithm is described (docs/references.md); the rest: Thakur, Rabenseifner & Gropp 2005."""


def as_dict(ex: Explanation, count: int, vols: list[Volume]) -> dict:
    """Plain data for `--json`: every symbol spelled out in full."""
    def bufs(rows):
        return [[fmt(v, compact=False) for v in row] for row in rows]

    steps = [{"step": s, "messages": [{"src": m.src, "dst": m.dst, "round": m.round,
                                       "contents": [fmt(v, compact=False) for v in m.contents]}
                                      for m in ex.messages_at(s)],
              "holdings": bufs(ex.holdings[s - 1])} for s in range(1, ex.steps + 1)]
    return {"collective": ex.collective, "algorithm": ex.algorithm, "world": ex.world, "root": ex.root,
            "ranks_per_node": ex.ranks_per_node, "summary": ex.summary, "initial": bufs(ex.initial),
            "steps": steps, "final": bufs(ex.final), "rounds": list(ex.rounds),
            "totals": {"count": count, "itemsize": ITEMSIZE, "bytes": count * ITEMSIZE, "steps": ex.steps,
                       "ranks": [dict(rank=r, **dataclasses.asdict(v)) for r, v in enumerate(vols)]}}


def _rank(r: int) -> str:
    return letter(r).upper()


def _table(rows, compact: bool, before=None, width: int = 0) -> Table:
    """What every rank holds, one column per chunk; cells changed since `before` in bold."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("rank")
    for i in range(len(rows[0]) if rows else 0):
        table.add_column(f"chunk {i}", justify="center", min_width=width)
    for r, row in enumerate(rows):
        cells = [Text(fmt(v, compact), style="bold" if before is not None and v != before[r][i] else "")
                 for i, v in enumerate(row)]
        table.add_row(f"{_rank(r)} ({r})", *cells)
    return table


def _bytes(b: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:.4g} {unit}"
    return f"{b} B"


def render(ex: Explanation, count: int, vols: list[Volume], console: Console | None = None) -> None:
    """The walk-through for people: each step's messages and the table of holdings after it."""
    n = ex.world
    compact = n > 4  # full sums (a0+b0+c0+d0) up to four ranks, a0+…+e0 beyond
    width = max(len(fmt(v, compact)) for rows in (ex.initial, ex.final, *ex.holdings)
                for row in rows for v in row)
    console = console or Console(highlight=False)
    if not console.is_terminal:  # piped or captured: wide enough that no symbol is cut or wrapped
        console = Console(highlight=False, width=max(100, 10 + n * (max(width, 7) + 3)), file=console.file)
    ranks = f"{n} ranks {_rank(0)}-{_rank(n - 1)}" if n > 1 else "1 rank A"
    rooted = f", root {_rank(ex.root)} ({ex.root})" if ex.collective in ROOTED else ""
    nodes = (f", {ex.ranks_per_node} ranks per node"
             if ex.algorithm in NODE_AWARE and ex.ranks_per_node else "")
    console.rule(f"{ex.collective.replace('_', '-')} · {ex.algorithm} · {ranks}{rooted}{nodes}")
    source = SOURCES.get(ex.algorithm, "Thakur, Rabenseifner & Gropp 2005")
    console.print(ex.summary if source.split()[0] in ex.summary else f"{ex.summary} ({source})")
    console.print(f"Rank r's input element i is written letter(r)+i (rank {_rank(0)}'s are a0, a1, …); "
                  "a sum is a reduction; '·' is not written yet.")

    def table(heading: str, rows, before=None) -> None:
        console.print(Text(heading, style="bold"))
        console.print(_table(rows, compact, before, width))

    if ex.collective == "all_to_all":
        table("Initially (send buffers; below: receive buffers)", ex.initial)
        prev = tuple((None,) * n for _ in range(n))
    else:
        table("Initially", ex.initial)
        prev = ex.initial
    for s in range(1, ex.steps + 1):
        console.print(Text(f"Step {s}", style="bold underline"))
        console.print(Text("\n".join(f"  {_rank(m.src)} → {_rank(m.dst)}: "
                                      + ", ".join(fmt(v, compact) for v in m.contents)
                                      for m in ex.messages_at(s))))
        table(f"After step {s}", ex.holdings[s - 1], prev)
        prev = ex.holdings[s - 1]
    if ex.steps == 0:
        table("One rank: nothing to send. Result", ex.final)
    _render_totals(console, ex, count, vols)


def _render_totals(console: Console, ex: Explanation, count: int, vols: list[Volume]) -> None:
    size = count * ITEMSIZE
    console.print(Text(f"Totals from the planner (ringzero.plan.comm.volume) for S = {count} float32 "
                       f"elements ({_bytes(size)}), in bytes; {ex.steps} steps above", style="bold"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("rank", "rounds", "sent", "received", "sent / S", "msgs sent", "msgs recv", "reduced"):
        table.add_column(col, justify="left" if col == "rank" else "right")
    for r, v in enumerate(vols):
        ratio = f"{v.bytes_sent / size:.3f}" if size else "-"
        table.add_row(f"{_rank(r)} ({r})", str(v.rounds), f"{v.bytes_sent:,}", f"{v.bytes_recv:,}", ratio,
                      str(v.messages_sent), str(v.messages_recv), f"{v.bytes_reduced:,}")
    console.print(table)
