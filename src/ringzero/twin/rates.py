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


STEP_BOUND = 0.15
"""How close the step-time twin holds on a machine whose load stays put (docs/twins.md: every
configuration measured within 15 % in the median)."""


def unsteady(probes: dict) -> str | None:
    """Why the step-time twin cannot be held to `STEP_BOUND` on this run, when its own probes show the
    machine's load moved while it ran (`probes`: `report.probe_summary`'s); None otherwise.

    The prediction prices the median probe point, and the steps ran under whatever load came between
    the points. When half the points' predictions lie more than the bound from their median (their
    median absolute deviation over the median; unlike their range, it does not widen with the number
    of points, 2 to 16), the load the steps saw is not known to the bound. Measured on this 2-core
    machine, shared with other jobs, beside a CPU hog (`ringzero train --nproc 2 --strategy dp
    --straggler 1:2 --steps 30`, 9 runs): step time -12 to +36 %, 6 of them past 15 %, all 6 with a
    deviation of 18-31 %; the 3 within 15 % at 11, 20 and 28 %; without the hog +0.1 % at 3 % and
    -4.2 % at 7 %. Past the bound the miss is not certain: holding it is a matter of where the load
    happened to fall."""
    steps = [p["predicted"]["step"] for p in (probes or {}).get("points", [])]
    if len(steps) < 2:
        return None
    mid = statistics.median(steps)
    deviation = statistics.median(abs(x - mid) for x in steps) / mid
    if deviation <= STEP_BOUND:
        return None
    return (f"step time within {STEP_BOUND:.0%}: the machine's load moved while the run trained (the step predicted "
            f"at the {len(steps)} probe points spans {min(steps) * 1e3:,.1f}-{max(steps) * 1e3:,.1f} ms, half of them "
            f"{deviation:.0%} or more from their median, past {STEP_BOUND:.0%}); the prediction prices the median "
            f"point, the steps ran under the load between the points")
