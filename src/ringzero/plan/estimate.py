"""The whole plan for one configuration: size, compute, memory, communication and time together,
and its stable JSON form (`to_dict`, schema "ringzero.plan/1", documented in the README).

Units: bytes, seconds, FLOPs, tokens; per GPU means the busiest GPU; per step means one optimizer
step over the global batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ringzero.plan.model import flops
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import Hardware
from ringzero.plan.strategies.memory import Memory, memory
from ringzero.plan.model.shapes import ModelShape, ParamCount, approx_params, param_count
from ringzero.plan.step_time import StepTime, comm_ops, op_seconds, step_time
from ringzero.plan.strategies.traffic import KINDS, CommOp

SCHEMA = "ringzero.plan/1"


@dataclass(frozen=True)
class Estimate:
    """Everything `ringzero plan` prints for one configuration."""

    model: ModelShape
    training: Training
    parallel: Parallel
    hardware: Hardware
    params: ParamCount
    tokens: float
    """Training tokens D (given, or 20 per parameter)."""
    memory: Memory
    ops: tuple[CommOp, ...]
    time: StepTime
    days: float | None = None
    """Target training time for `gpus_for_days`, if asked."""

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.hardware.hbm_bytes

    @property
    def tokens_per_step(self) -> int:
        return self.training.sequences_per_step(self.parallel.dp) * self.model.seq

    @property
    def flops_per_step(self) -> float:
        """Hardware FLOPs of one step (recomputation included)."""
        return flops.hardware_flops_per_token(self.params.total, self.parallel.recompute, self.model) \
            * self.tokens_per_step

    @property
    def flops_total(self) -> float:
        return flops.training_flops(self.params.total, self.tokens, self.parallel.recompute, self.model)

    @property
    def days_at_target_mfu(self) -> float:
        """Training days at the hardware's target MFU: the model FLOPs 6·N·D (what MFU counts,
        whatever is recomputed) over GPUs x peak x target."""
        return flops.training_days(flops.model_flops_per_token(self.params.total) * self.tokens,
                                   self.parallel.gpus, self.hardware.peak_flops, self.hardware.target_mfu)

    def gpus_for(self, days: float) -> int:
        """GPUs to train in `days` at the hardware's target MFU (6·N·D model FLOPs)."""
        return flops.gpus_needed(flops.model_flops_per_token(self.params.total) * self.tokens, days,
                                 self.hardware.peak_flops, self.hardware.target_mfu)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.time.step

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation implied by the step time (6N per token, PaLM's definition)."""
        return flops.model_flops_per_token(self.params.total) * self.tokens_per_s / (
            self.parallel.gpus * self.hardware.peak_flops)

    def comm_bytes(self, kind: str) -> float:
        """Bytes the busiest GPU sends per step for `kind` ("dp", "zero", "tp", "pp")."""
        return sum(o.bytes_sent for o in self.ops if o.kind == kind)


def check(m: ModelShape, tr: Training, par: Parallel) -> None:
    """A one-line ValueError when this configuration cannot run: a layout the model cannot be split
    into (`plan.search.layout_check`: tp not dividing the heads, kv heads or MLP width, or the sequence
    under sequence parallelism; more stages than layers), a global batch that micro_batch x dp
    does not divide, or a pipeline its schedule cannot run (`plan.pipeline.schedule.check`: more model
    chunks than layers, or an interleaved schedule whose micro-batches are not a multiple of pp)."""
    from ringzero.plan.search import layout_check
    layout_check.check(m, par)
    micro = tr.accumulation(par.dp)
    pipeline.check(par.pp, m.layers, micro, par.schedule, par.virtual_stages)


def estimate(m: ModelShape, tr: Training, par: Parallel, hw: Hardware, *, days: float | None = None) -> Estimate:
    """Plan configuration (`m`, `tr`, `par`) on `hw` (ValueError when it cannot run: `check`)."""
    check(m, tr, par)
    params = param_count(m)
    tokens = tr.tokens if tr.tokens is not None else 20.0 * params.total
    ops = tuple(comm_ops(m, tr, par, hw))
    return Estimate(model=m, training=tr, parallel=par, hardware=hw, params=params, tokens=tokens,
                    memory=memory(m, tr, par), ops=ops, time=step_time(m, tr, par, hw, list(ops)),
                    days=days)


def _op_dict(o: CommOp, hw: Hardware) -> dict:
    v = o.volume()
    return {"kind": o.kind, "what": o.what, "collective": o.collective, "algorithm": o.algorithm,
            "group": o.group, "link": "network" if o.spans_nodes else "nvlink", "calls": o.calls,
            "bytes_per_call": v.bytes_sent, "rounds_per_call": v.rounds, "bytes": o.bytes_sent,
            "seconds": op_seconds(o, hw), "overlaps": o.overlap}


def to_dict(e: Estimate) -> dict:
    """The JSON form (schema "ringzero.plan/1"; keys are stable, values in bytes/seconds/FLOPs)."""
    mem, t, hw = e.memory, e.time, e.hardware
    out = {
        "schema": SCHEMA,
        "inputs": {"model": dataclasses.asdict(e.model), "training": dataclasses.asdict(e.training),
                   "parallel": dataclasses.asdict(e.parallel), "hardware": dataclasses.asdict(hw),
                   "gpus": e.parallel.gpus, "tokens": e.tokens},
        "params": e.params.total,
        "params_approx": approx_params(e.model.layers, e.model.hidden),
        "params_by_component": {k: getattr(e.params, k) for k in
                                ("embedding", "positions", "attention", "mlp", "norms", "head")},
        "flops_per_step": e.flops_per_step,
        "flops_total": e.flops_total,
        "memory": {"params": mem.params, "grads": mem.grads, "optimizer": mem.optimizer,
                   "activations": mem.activations, "buffers": mem.buffers, "total": mem.total,
                   "offloaded": mem.offloaded, "hbm": hw.hbm_bytes},
        "fits": e.fits,
        "comm": {k: e.comm_bytes(k) for k in KINDS},
        "comm_ops": [_op_dict(o, hw) for o in e.ops],
        "time": {"compute": t.compute, "forward": t.forward, "backward": t.backward, "comm": t.comm,
                 "exposed_comm": t.exposed_comm, "bubble": t.bubble, "offload": t.offload,
                 "optimizer": t.optimizer, "step": t.step},
        "bubble_fraction": t.bubble_fraction,
        "mfu": e.mfu,
        "tokens_per_s": e.tokens_per_s,
        "training_days": {
            "at_target_mfu": e.days_at_target_mfu,
            "at_step_time": e.tokens / e.tokens_per_s / flops.SECONDS_PER_DAY},
    }
    if e.days is not None:
        out["gpus_for_days"] = {"days": e.days,
                                "gpus": e.gpus_for(e.days)}
    return out
