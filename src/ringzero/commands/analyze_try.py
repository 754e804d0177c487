"""`ringzero analyze REPORT.json --try-best`: the analysis's twin. The report's run is run again
as it was (the baseline) and with the top suggestion's flags (the same command line otherwise:
the same seed, steps and ranks), alternated, baseline first, for a few rounds, and the change's
measured tokens per second over the baseline's is set beside the predicted gain.

Why both, now, and alternated: a machine that others share runs at another speed from one minute
to the next, so the report's own figure (measured then) against the change's (measured now) gives
the change the credit for whatever the load did in between; runs taken in turns see the same load
on average, and the median of each side's rounds drops a round that drew a burst."""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import tempfile

from ringzero.errors import UsageError

OUTPUTS = ("--json-report", "--trace", "--profile", "--pipeline-plot", "--html-report", "--trace-steps")
"""The flags of the first run's outputs, which the reruns do not write again."""
ROUNDS = 3
"""Baseline and change runs each, by default (`--try-rounds`)."""


def rerun_argv(argv: list[str], flags: list[str], report: str) -> list[str]:
    """`argv` (a `ringzero train` command line) without its outputs, with `flags` (which win:
    argparse keeps a flag's last value) and a report to `report`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in OUTPUTS:
            skip = "=" not in a
            continue
        out.append(a)
    return [*out, *flags, "--json-report", report, "--quiet"]


def _measured(report: dict) -> float:
    return report["twins"]["tokens per second"]["measured"]


def train(argv: list[str], folder: str) -> dict:
    """Run `ringzero train` with `argv` (its report in the temporary `folder`) and return the report.
    What it prints is kept from the terminal: its table is not this command's output, and the
    paths it names are deleted with the folder."""
    from ringzero import cli
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = cli.main(argv)
    if code != 0:
        last = (said.getvalue().strip().splitlines() or [""])[-1].replace(folder, "<temporary folder>")
        raise RuntimeError(f"ringzero {' '.join(argv[:-3])} failed (exit {code}): {last}")
    with open(argv[argv.index("--json-report") + 1], encoding="utf-8") as f:
        return json.load(f)


def try_best(report: dict, suggestions: list[dict], rounds: int = ROUNDS) -> dict:
    """Run the report's run (the baseline) and its best suggestion (`suggestions[1]`: [0] is the run
    itself) in turns, `rounds` times each; {"flags", "predicted_gain", "measured_gain" (the medians'
    ratio), "baseline_tokens_per_s", "change_tokens_per_s" (the medians), "runs" ([{"change": bool,
    "tokens_per_s"}] in the order run), "line", "config" (the change's)}."""
    if len(suggestions) < 2:
        raise UsageError("analyze --try-best: the planner has no suggestion for this run")
    best = suggestions[1]
    runs, config = [], None
    with tempfile.TemporaryDirectory() as folder:
        for i in range(2 * rounds):
            change = i % 2 == 1
            path = os.path.join(folder, f"report{i}.json")
            done = train(rerun_argv(report["argv"], best["flags"] if change else [], path), folder)
            runs.append({"change": change, "tokens_per_s": _measured(done)})
            config = done["config"] if change else config
    base = statistics.median(r["tokens_per_s"] for r in runs if not r["change"])
    new = statistics.median(r["tokens_per_s"] for r in runs if r["change"])
    gain = new / base
    line = (f"tried: {best['why']} ({' '.join(best['flags'])}), {rounds} round{'s' if rounds > 1 else ''} of the "
            f"run as it was and changed, in turns: tokens per second {base:,.0f} -> {new:,.0f} (medians), "
            f"measured gain {gain:.2f}x, predicted {best['gain']:.2f}x ({(gain - best['gain']) / best['gain']:+.1%})")
    return {"flags": best["flags"], "predicted_gain": best["gain"], "measured_gain": gain,
            "baseline_tokens_per_s": base, "change_tokens_per_s": new, "runs": runs, "line": line, "config": config}
