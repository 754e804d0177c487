"""`make bench`: ringzero's dp and zero3 against torch's DDP and FSDP2, and recomputation (issue 4).

Runs `ringzero bench train` on 2 and then 4 local gloo ranks (recomputation, which runs on one rank,
only with the first), prints each report and writes both to out/bench_train.json, with the
command lines that reproduce them. Times on a shared 2-core machine are noisy: read the ratios
(the variants are interleaved step by step within a run), not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ringzero.bench import train
from ringzero.bench.comm_report import make_console


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", default="2,4", help="comma list of rank counts (default 2,4)")
    p.add_argument("--out", default="out/bench_train.json")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: options for `ringzero bench train` (e.g. -- --steps 20)")
    args = p.parse_args(argv)
    extra = [a for a in args.extra if a != "--"]
    console = make_console()
    runs, t0 = {}, time.time()
    for i, nproc in enumerate(int(n) for n in args.nprocs.split(",")):
        suites = "dp,zero3,recompute" if i == 0 else "dp,zero3"
        argv_n = ["--nproc", str(nproc), "--suites", suites, *extra]
        parser = argparse.ArgumentParser()
        train.add_arguments(parser)
        console.rule(f"ringzero bench train {' '.join(argv_n)}")
        result = train.benchmark(parser.parse_args(argv_n))
        result["command"] = "ringzero bench train " + " ".join(argv_n)
        train.print_report(result, console)
        runs[str(nproc)] = result
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {n: r["ratios"] for n, r in runs.items()}
    out.write_text(json.dumps({"runs": runs, "ratios": summary, "seconds": time.time() - t0}, indent=1) + "\n")
    console.print(f"wrote {out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
