"""`ringzero train --html-report`: one self-contained page, opened in a real headless Chromium: it
renders without script errors or network requests, holds the twin table (its numbers the JSON
report's) and every chart; and its bad input."""

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from ringzero import cli

from cli_errors import forbid_ranks, train_fails

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHARTS = ("chart-loss", "chart-memory", "chart-kinds", "chart-gantt")


def _chromium(tmp_path, *args):
    if not os.path.exists(CHROMIUM) and shutil.which("chromium") is None:
        pytest.fail("Chromium is not installed: the browser test needs it (scripts/test-deps, which make test runs, installs it)")
    exe = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=90)


class _Tables(HTMLParser):
    """The rows of the table with id `want`, as lists of cell texts."""
    def __init__(self, want):
        super().__init__()
        self.want, self.inside, self.rows = want, False, []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.inside = dict(attrs).get("id") == self.want
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.rows[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


_RUN: dict = {}


def _run(tmp_path_factory):
    if not _RUN:
        d = tmp_path_factory.mktemp("page")
        argv = ["train", "--nproc", "2", "--model", "nano", "--seq", "16", "--micro-batch", "2", "--steps", "4",
                "--max-bytes", "65536", "--strategy", "zero2", "--trace", str(d / "trace"),
                "--json-report", str(d / "report.json"), "--html-report", str(d / "page.html"), "--quiet"]
        assert cli.main(argv) == 0
        _RUN.update(folder=d, report=json.loads((d / "report.json").read_text()), page=(d / "page.html").read_text())
    return _RUN


@pytest.mark.timeout(240)
def test_the_page_renders_in_chromium_with_every_chart_and_no_script_error(tmp_path_factory, tmp_path):
    run = _run(tmp_path_factory)
    page = run["page"]
    assert "<script" not in page and not re.search(r'(src|href)\s*=\s*"https?:', page), "the page reaches out"
    done = _chromium(tmp_path, "--dump-dom", f"file://{run['folder'] / 'page.html'}")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    for chart in CHARTS:
        assert re.search(rf'<svg[^>]*id="{chart}"', dom), chart
    assert "Uncaught" not in done.stderr and ":CONSOLE(" not in done.stderr, done.stderr[-2000:]
    twins = _Tables("twins")
    twins.feed(dom)
    assert len(twins.rows) == 1 + len(run["report"]["twins"])
    shot = tmp_path / "page.png"
    done = _chromium(tmp_path, "--window-size=1200,3400", f"--screenshot={shot}", f"file://{run['folder'] / 'page.html'}")
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def _figures(monkeypatch) -> dict:
    """The figures the charts draw, by chart id, kept as `charts.svg` receives them."""
    from ringzero.page import charts
    drawn, svg = {}, charts.svg
    monkeypatch.setattr(charts, "svg", lambda fig, chart_id: drawn.setdefault(chart_id, fig) and svg(fig, chart_id))
    return drawn


def test_no_legend_covers_a_chart_and_the_timeline_names_its_steps(tmp_path_factory, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from ringzero.page import html
    run = _run(tmp_path_factory)
    merged = html.merged_trace(str(run["folder"] / "trace"))
    drawn = _figures(monkeypatch)
    html.page(run["report"], merged)
    assert set(drawn) == set(CHARTS)
    for fig in drawn.values():
        FigureCanvasAgg(fig).draw()
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent()
        assert not legend.overlaps(ax.get_window_extent()), fig     # bars, lines, the rank-0 bar
        assert not legend.overlaps(ax.xaxis.label.get_window_extent()), fig
    steps = [e["name"] for e in merged["traceEvents"] if e.get("cat") == "step" and e["pid"] == 0]
    shown = [t.get_text() for t in drawn["chart-gantt"].axes[0].texts]
    assert steps and shown == steps == [f"step {i}" for i in range(1, 5)]   # as the progress line: 1/4 to 4/4


def test_the_pages_twin_table_holds_the_json_reports_numbers(tmp_path_factory):
    run = _run(tmp_path_factory)
    twins = _Tables("twins")
    twins.feed(run["page"])
    by_name = {r[0]: r[1:] for r in twins.rows[1:]}
    assert set(by_name) == set(run["report"]["twins"])
    for name, t in run["report"]["twins"].items():
        if t["unit"] == "bytes":             # exact integers: the page prints them whole
            shown = [int(c.removesuffix(" B").replace(",", "")) for c in by_name[name][:2]]
            assert shown == [t["predicted"], t["measured"]], name
        if t["error"] is not None:
            assert by_name[name][2] == f"{t['error']:+.1%}", name


def test_analyze_writes_the_same_page_for_an_existing_report(tmp_path_factory, tmp_path):
    run = _run(tmp_path_factory)
    out = tmp_path / "again.html"
    assert cli.main(["analyze", str(run["folder"] / "report.json"), "--html-report", str(out)]) == 0
    assert out.read_text() == run["page"]


@pytest.mark.parametrize("argv,words", [
    (["--html-report", "DIR"], ("--html-report", "is a folder")),
    (["--html-report", "missing/page.html"], ("--html-report", "does not exist")),
    (["--html-report", "page.txt"], ("--html-report", "FILE.html")),
])
def test_bad_html_report_input_is_one_line_before_any_rank(capsys, tmp_path, monkeypatch, argv, words):
    forbid_ranks(monkeypatch)
    (tmp_path / "DIR").mkdir()
    argv = [str(tmp_path / a) if a in ("DIR", "missing/page.html", "page.txt") else a for a in argv]
    train_fails(capsys, tmp_path, ["--model", "nano", *argv], *words)
