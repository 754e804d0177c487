"""`ringzero analyze REPORT.json --try-best`: the analysis's twin. The report's run is run again
with the top suggestion's flags (the same command line otherwise: the same seed, steps and ranks)
and its measured tokens per second is set beside the prediction."""

from __future__ import annotations

import json
import os
import tempfile

from ringzero.errors import UsageError

OUTPUTS = ("--json-report", "--trace", "--profile", "--pipeline-plot", "--html-report", "--trace-steps")
"""The flags of the first run's outputs, which the rerun does not write again."""


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


def try_best(report: dict, suggestions: list[dict]) -> dict:
    """Rerun the best suggestion (`suggestions[1]`: [0] is the run itself); {"flags", "predicted_gain",
    "measured_gain", "line", "config" (the rerun's)}."""
    from ringzero import cli
    if len(suggestions) < 2:
        raise UsageError("analyze --try-best: the planner has no suggestion for this run")
    best = suggestions[1]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "report.json")
        code = cli.main(rerun_argv(report["argv"], best["flags"], path))
        if code != 0:
            raise RuntimeError(f"the rerun with {' '.join(best['flags'])} failed (exit {code})")
        with open(path, encoding="utf-8") as f:
            again = json.load(f)
    gain = _measured(again) / _measured(report)
    line = (f"tried: {best['why']} ({' '.join(best['flags'])}): tokens per second {_measured(report):,.0f} -> "
            f"{_measured(again):,.0f}, measured gain {gain:.2f}x, predicted {best['gain']:.2f}x "
            f"({(gain - best['gain']) / best['gain']:+.1%})")
    return {"flags": best["flags"], "predicted_gain": best["gain"], "measured_gain": gain, "line": line,
            "config": again["config"]}
