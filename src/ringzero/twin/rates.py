"""The in-run probes' rates as the step-time prediction reads them (`train.probe` measures them):
each probed collective's name, the block's rate pooled over every rank's points, and the medians
over a rank's points."""

from __future__ import annotations

import statistics


def call_key(collective: str, elements: int, itemsize: int, group: str = "dp") -> str:
    """The name of one probed collective in `Prober`'s output (and the JSON report); one outside the
    dp group is prefixed with its group ("tp:", "tp_step:", `predict.grouped_calls`)."""
    return ("" if group == "dp" else f"{group}:") + f"{collective}/{elements}x{itemsize}"


def pooled_flops(points_by_rank: list[list[dict]], point: int | None = None) -> float:
    """The median block rate over every rank's probe points (or over the ranks' `point`-th).

    Not the busiest rank's own: with more ranks than cores the ranks take turns at a core of their
    own (3 ranks on 2 cores: two share one while the third runs alone, 2x faster), and over a run
    every rank has every turn, while at a handful of probe points one rank may draw the lone core
    most times. Measured on 3 ranks of 2 cores (ZeRO-3, bf16 and fp32), the busiest rank's own rate
    put compute 14-55 % below the run, the pooled median within 15 %; on 2 and 4 ranks both were
    within 7 % (the compute twin of `ringzero train --nproc 3 --strategy zero3 --precision bf16
    --steps 40`, then `--precision fp32`, `--nproc 2`, `--nproc 4`; the busiest rank's figure with
    its own rate returned here in place of the pooled median)."""
    return statistics.median(p["flops"] for points in points_by_rank
                             for p in (points if point is None else points[point:point + 1]))


def median_rates(points: list[dict]) -> dict:
    """The median of each rate over the probe points (a collective's seconds key by key)."""
    comm_keys = points[0]["comm"]
    out = {"flops": statistics.median(p["flops"] for p in points),
           "optimizer_s_per_param": statistics.median(p["optimizer_s_per_param"] for p in points),
           "comm": {k: statistics.median(p["comm"][k] for p in points) for k in comm_keys}}
    for key in ("alone_flops", "tp_layer_comm_s", "compress_s"):
        if all(key in p for p in points):
            out[key] = statistics.median(p[key] for p in points)
    return out
