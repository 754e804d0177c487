"""The step-time model against published runs: predicted vs published teraFLOP/s per GPU.

Every case of `ringzero.plan.published` (Narayanan et al. 2021 Table 1, BLOOM-176B, MT-NLG 530B)
on one hardware preset's defaults, no per-case tuning; the mean and worst absolute error over the
cases the bound holds (`Case.checked`), as `tests/test_plan_fidelity.py` asserts them.

    .venv/bin/python benchmarks/bench_plan_fidelity.py [--gpu a100-80gb] [--json out/fidelity.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ringzero.plan.hardware import HARDWARE, hardware
from ringzero.plan.published import fidelity, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="a100-80gb", help=f"{', '.join(HARDWARE)} (default a100-80gb)")
    ap.add_argument("--json", metavar="OUT", type=Path, help="also write the table as JSON")
    args = ap.parse_args(argv)
    rows = fidelity(hardware(args.gpu))
    mean, worst = summary(rows)
    print("| case | layout (dp x tp x pp, v; micro-batch / global) | published | predicted | error |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        p, tr = r.case.parallel, r.case.training
        layout = (f"{p.dp} x {p.tp} x {p.pp}" + (f", v {p.virtual_stages}" if p.virtual_stages > 1 else "")
                  + f"; {tr.micro_batch} / {tr.global_batch}")
        note = "" if r.case.checked else " (not in the bound)"
        print(f"| {r.case.name}{note} | {layout} | {r.case.tflops:g} | {r.predicted:.1f} | {r.error:+.1%} |")
    print(f"\nmean absolute error {mean:.1%}, worst {worst:.1%} over the {sum(r.case.checked for r in rows)} "
          f"checked cases ({args.gpu} defaults)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "gpu": args.gpu, "mean_abs_error": mean, "max_abs_error": worst,
            "cases": [{"name": r.case.name, "source": r.case.source, "checked": r.case.checked,
                       "published_tflops": r.case.tflops, "predicted_tflops": r.predicted, "error": r.error}
                      for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
