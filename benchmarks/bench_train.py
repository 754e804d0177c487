"""`make bench`: ringzero's dp, zero3, tensor and pipeline parallelism against torch's DDP, FSDP2,
parallelize_module and torch.distributed.pipelining, recomputation, gradient compression against
DDP's comm hooks, and ZeRO++ against ZeRO-3 over two emulated nodes.

Runs `ringzero bench train` on 2 and then 4 local gloo ranks (recomputation, which runs on one rank,
only with the first; tensor and pipeline parallelism over all the ranks, `--tp N --pp N`) against
peers using torch's default AdamW (foreach), then dp and zero3 again on 2 ranks against peers using
torch's fused AdamW, the fastest optimizer torch has for them (ringzero always runs the fused kernel
on its flat shards). Prints each report and writes them to out/bench_train.json, with the command
lines that reproduce them. Times on a shared 2-core machine
are noisy: read the ratios (the variants are interleaved step by step within a run), not the
absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ringzero.bench import train, zeropp
from ringzero.bench.train_report import print_report
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
    nprocs = [int(n) for n in args.nprocs.split(",")]
    plan = [(str(n), n, "dp,zero3,recompute" if i == 0 else "dp,zero3", "foreach") for i, n in enumerate(nprocs)]
    plan.append((f"{nprocs[0]}-fused", nprocs[0], "dp,zero3", "fused"))
    # gradient compression against DDP with the matching comm hook (top-k: plain DDP)
    plan += [(f"{n}-compress-{s}", n, "compress", s) for n in nprocs for s in ("fp16", "bf16", "powersgd", "topk")]
    for label, nproc, suites, adam in plan:
        # tensor and pipeline parallelism over every rank
        tp = ["--tp", str(nproc), "--pp", str(nproc)] if adam == "foreach" else []
        what = ["--compress", adam] if suites == "compress" else ["--torch-adam", adam]
        argv_n = ["--nproc", str(nproc), "--suites", suites, *tp, *what, *extra]
        parser = argparse.ArgumentParser()
        train.add_arguments(parser)
        console.rule(f"ringzero bench train {' '.join(argv_n)}")
        result = train.benchmark(parser.parse_args(argv_n))
        result["command"] = "ringzero bench train " + " ".join(argv_n)
        print_report(result, console)
        runs[label] = result
    for nproc in nprocs:                 # ZeRO++ against ZeRO-3, two emulated nodes, a slow and a fast link
        for gbps in ("0.1", "1"):
            argv_n = ["--nproc", str(nproc), "--strategy", "zero3", "--zeropp", "qwz,hpz,qgz", "--ranks-per-node",
                      str(max(1, nproc // 2)), "--emulate-inter-node", gbps, *extra]
            parser = argparse.ArgumentParser()
            train.add_arguments(parser)
            console.rule(f"ringzero bench train {' '.join(argv_n)}")
            result = zeropp.benchmark(parser.parse_args(argv_n))
            result["command"] = "ringzero bench train " + " ".join(argv_n)
            zeropp.print_report(result)
            runs[f"{nproc}-zeropp-{gbps}GBps"] = result
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {n: r["ratios"] for n, r in runs.items()}
    out.write_text(json.dumps({"runs": runs, "ratios": summary, "seconds": time.time() - t0}, indent=1) + "\n")
    console.print(f"wrote {out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
