"""Where gradient compression pays (`ringzero.bench.compress_sweep`): DP step time with and without
fp16, bf16, PowerSGD and top-k over the link emulator at 0.05-5 GB/s, on 2 and 4 ranks, against the
planner's break-even bandwidth; a markdown table, a plot and the JSON.

    python benchmarks/bench_compression.py --json out/bench_compression.json --plot out/compression.png
"""

from __future__ import annotations

import argparse
import json
import os

from ringzero.bench import compress_sweep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--gbps", default=",".join(f"{g:g}" for g in compress_sweep.BANDWIDTHS))
    p.add_argument("--schemes", default=",".join(compress_sweep.SCHEMES))
    p.add_argument("--json", default="out/bench_compression.json")
    p.add_argument("--plot", default="out/compression.png")
    a = p.parse_args()
    rows = compress_sweep.sweep([int(w) for w in a.worlds.split(",")], [float(g) for g in a.gbps.split(",")],
                                a.schemes.split(","))
    print(compress_sweep.render(rows))
    for path in (a.json, a.plot):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(rows, f, indent=1)
    compress_sweep.plot(rows, a.plot)


if __name__ == "__main__":
    main()
