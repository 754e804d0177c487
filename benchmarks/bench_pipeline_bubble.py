"""The pipeline bubble on the clock: each stage's measured idle fraction against the planner's
(p-1)/(m+p-1), (p-1)/(v·m+p-1) interleaved (Narayanan et al. 2021 §2.2).

Every stage's forward takes `--forward` ms and its backward `--backward` ms (`--pipeline-cost`: a
sleep fills each action up to its cost, so the ranks' sharing of two cores matters less), ringzero's
GPT at its smallest runs `--steps` steps of each case on local ranks, and the idle fraction is the
median over steps of each stage's time outside its forwards and backwards (`twin.pipeline.
measured_bubble`). A loaded machine stretches the compute inside each action past its cost and the
idle fraction falls below the bubble: that is why this comparison is a benchmark and the test suite
checks the order of the actions instead (`tests/test_train_pipeline.py`).

    python benchmarks/bench_pipeline_bubble.py
    python benchmarks/bench_pipeline_bubble.py --forward 20 --backward 40 --steps 4
"""

from __future__ import annotations

import argparse

from ringzero import launch
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank
from ringzero.twin import pipeline as pipe

CASES = [("gpipe", 2, 2, 1), ("1f1b", 2, 5, 1), ("1f1b", 3, 3, 1), ("gpipe", 3, 7, 1),
         ("1f1b", 4, 1, 1), ("1f1b", 4, 4, 1), ("interleaved", 2, 4, 2)]
"""(schedule, stages p, micro-batches m, virtual stages v)."""


def _timelines(cfg: TrainConfig):
    r = train_rank(cfg, calibrate=False)
    return r.stage, r.timelines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forward", type=float, default=50.0, help="each stage's forward, in ms")
    ap.add_argument("--backward", type=float, default=100.0, help="each stage's backward, in ms")
    ap.add_argument("--steps", type=int, default=3, help="steps per case (the first is left out)")
    args = ap.parse_args()
    print(f"{'schedule':<12} {'p':>2} {'m':>2} {'v':>2} {'measured idle':>14} {'planner':>8} {'error (points)':>15}")
    for schedule, p, m, v in CASES:
        cfg = TrainConfig(model="nano", layers=8, seq=16, steps=args.steps, micro_batch=1, eval_every=1000,
                          eval_batches=1, max_bytes=1 << 16, clip=None, pp=p, grad_accum=m, schedule=schedule,
                          virtual_stages=v, pipeline_cost=(args.forward / 1e3, args.backward / 1e3))
        out = sorted(launch.spawn(_timelines, p, args=(cfg,)))
        measured = pipe.measured_bubble([t for _, t in out])
        predicted = pipe.bubble(cfg)
        print(f"{schedule:<12} {p:>2} {m:>2} {v:>2} {measured:>14.3f} {predicted:>8.3f} "
              f"{100 * (measured - predicted):>+15.1f}")


if __name__ == "__main__":
    main()
