"""Predicted beside measured: the table (and JSON) that closes every training run.

Each row is a twin: a quantity `ringzero.plan` predicts for this exact configuration and the same
quantity measured on the ranks, with the relative error (measured - predicted) / predicted. Figures
are the busiest rank's (the maximum over ranks), per step or per micro-batch as named.

Step time: compute is the hardware FLOPs of the step (6N per token, 8N with full recomputation,
plus the attention matmuls, 12·L·s·h per token) at the FLOP/s a matmul probe of the model's own
shapes reached on every rank at once (the ranks share this machine's cores); communication is the
calibrated α-β-γ model (`ringzero bench comm --calibrate`, else its built-in defaults) summed over
the step's collectives, counted as exposed (on a machine whose cores the ranks share, compute and
communication hardly overlap); the optimizer is the fused AdamW kernel over this rank's shard at the
probed seconds per parameter plus its memory-bound passes outside the kernel at the probed memory
bandwidth (the norm's all-reduce, where ranks wait for each other, counts as communication).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..plan import flops
from ..plan.shapes import param_count
from . import predict
from .config import TrainConfig
from .engine import RankResult


@dataclass(frozen=True)
class Twin:
    name: str
    predicted: float
    measured: float
    unit: str

    @property
    def error(self) -> float | None:
        return None if not self.predicted else (self.measured - self.predicted) / self.predicted

    def to_json(self) -> dict:
        return {"predicted": self.predicted, "measured": self.measured, "unit": self.unit, "error": self.error}


def step_seconds(cfg: TrainConfig, world: int, res: RankResult) -> dict[str, float]:
    """The predicted phases of one step on this machine (see the module doc)."""
    m = cfg.shape
    n = param_count(m).total
    tokens = cfg.micro_batch * cfg.grad_accum * m.seq
    per_token = flops.hardware_flops_per_token(n, cfg.recompute, m) + flops.attention_flops_per_token(m)
    compute = per_token * tokens / res.probe["flops"]
    comm = predict.comm_seconds(cfg, world, res.buckets)
    optimizer = (predict.optimizer_bytes(cfg, world) / res.probe["bandwidth"]
                 + predict.optimizer_shard(cfg, world) * res.probe["adam_s_per_param"])
    return {"compute": compute, "comm": comm, "optimizer": optimizer, "step": compute + comm + optimizer}


def twins(cfg: TrainConfig, world: int, results: list[RankResult]) -> list[Twin]:
    busiest = max(results, key=lambda r: r.step_time)
    states = predict.states(cfg, world)
    sent = [predict.traffic(cfg, world, r.buckets, r.rank) for r in results]
    total_sent = [sum(op["bytes_sent"] for op in r.traffic.get("ops", {}).values()) for r in results]
    total_recv = [sum(op["bytes_recv"] for op in r.traffic.get("ops", {}).values()) for r in results]
    steps = step_seconds(cfg, world, busiest)
    tokens = cfg.global_batch(world) * cfg.shape.seq
    rows = [
        Twin("parameters held", states["params"], max(r.held["params"] for r in results), "bytes"),
        Twin("gradients held", states["grads"], max(r.held["grads"] for r in results), "bytes"),
        Twin("optimizer states held", states["optimizer"], max(r.held["optimizer"] for r in results), "bytes"),
        Twin("activations saved (one micro-batch)", predict.activations(cfg),
             max(r.activations for r in results), "bytes"),
    ]
    if world > 1:
        rows += [Twin("bytes sent per step", max(s["bytes_sent"] for s in sent), max(total_sent), "bytes"),
                 Twin("bytes received per step", max(s["bytes_recv"] for s in sent), max(total_recv), "bytes")]
    rows += [
        Twin("compute per step", steps["compute"], busiest.phases["forward"] + busiest.phases["backward"], "s"),
        Twin("exposed communication per step", steps["comm"], busiest.phases["comm"], "s"),
        Twin("optimizer per step", steps["optimizer"], busiest.phases["optimizer"], "s"),
        Twin("step time", steps["step"], busiest.step_time, "s"),
        Twin("tokens per second", tokens / steps["step"], tokens / busiest.step_time, "tokens/s"),
    ]
    return [r for r in rows if world > 1 or "communication" not in r.name]


def to_json(cfg: TrainConfig, world: int, results: list[RankResult], rows: list[Twin]) -> dict:
    r0 = results[0]
    return {"schema": "ringzero.train-report/1", "config": dataclasses.asdict(cfg), "world": world,
            "losses": r0.losses, "val": [{"step": s, "loss": v} for s, v in r0.val],
            "twins": {t.name: t.to_json() for t in rows}, "skipped_steps": r0.skipped,
            "probe": r0.probe}


def render(rows: list[Twin], console) -> None:
    from rich.table import Table
    table = Table(title="ringzero.plan's prediction beside the measurement (busiest rank)")
    for col, just in (("quantity", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right")):
        table.add_column(col, justify=just)
    for t in rows:
        err = "" if t.error is None else f"{t.error * 100:+.1f} %"
        table.add_row(t.name, _fmt(t.predicted, t.unit), _fmt(t.measured, t.unit), err)
    console.print(table)


def _fmt(x: float, unit: str) -> str:
    if unit == "bytes":
        return f"{x / 2**20:,.3f} MiB"
    if unit == "s":
        return f"{x * 1e3:,.1f} ms"
    return f"{x:,.0f} {unit}"
