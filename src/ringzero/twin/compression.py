"""The twins of gradient compression (`plan.strategies.compression`, run by `parallel.compression`):
the bytes a step sends with and without it and their ratio, the state its hook keeps, and its
compute per step.

The uncompressed figure is the planner's for the same run with compression off; its measured twin
is the traffic of the run's last step before compression starts (`train.steps.StepSpan.plain`),
when the run has one: both ratios are then measurements over predictions of the same steps.
"""

from __future__ import annotations

import dataclasses
import statistics

from ringzero.plan.strategies.compression import state_bytes
from ringzero.run import compress_options
from ringzero.run.compress_options import CompressConfig
from ringzero.run.config import TrainConfig
from ringzero.run.result import RankResult
from ringzero.twin import predict
from ringzero.twin.twin import Twin


def _sent(traffic: dict) -> int | None:
    ops = traffic.get("ops")
    return sum(op["bytes_sent"] for op in ops.values()) if ops else None


def twins(cfg: TrainConfig, world: int, results: list[RankResult], rates: dict) -> list[Twin]:
    """The rows above, for a run with compression on more than one dp rank ([] otherwise)."""
    c = compress_options.compression(cfg)
    if not c.on or cfg.placement(world).dp == 1 or cfg.parallel.comm_algorithm == "torch":
        return []
    plain_cfg = dataclasses.replace(cfg, compress=CompressConfig())
    r = max(results, key=lambda r: predict.traffic(cfg, world, r.buckets, r.rank, r.sp_elements)["bytes_sent"])
    sent = predict.traffic(cfg, world, r.buckets, r.rank, r.sp_elements)["bytes_sent"]
    plain = predict.traffic(plain_cfg, world, r.buckets, r.rank, r.sp_elements)["bytes_sent"]
    seen, seen_plain = _sent(r.traffic), _sent(r.traffic_plain)
    rows = [Twin("bytes sent per step without compression", plain, seen_plain, "bytes"),
            Twin(f"compression ratio ({c.scheme}: bytes sent without / with)", plain / sent,
                 (seen_plain or plain) / seen if seen else None, "x")]
    held = state_bytes(c, [b[2] for b in r.buckets], cfg.value_bytes, cfg.optim.precision == "fp16")
    if c.stateful:
        rows.append(Twin(f"{c.scheme} residual held", held["residual"], max(x.compress.get("residual", 0) for x in results),
                         "bytes"))
    if c.scheme == "powersgd":
        rows.append(Twin("PowerSGD Q held", held["q"], max(x.compress.get("q", 0) for x in results), "bytes"))
    spent = [s for s in r.compress_s if s is not None]
    if "compress_s" in rates and spent:
        rows.append(Twin(f"{c.scheme} compute per step", rates["compress_s"], statistics.median(spent), "s"))
    return rows
