"""What one training run does: a frozen, validated config in sections, one per option module, as
torchtitan's job config is (read from DeepSpeed JSON by `deepspeed.reader`).

    model       `model_options.ModelConfig`        the GPT preset, its length, depth, attention
    training    `training_options.TrainingConfig`  steps, batches, evaluation, data, recomputation
    optim       `optim_options.OptimConfig`        AdamW, the lr schedule, clipping, precision
    parallel    `parallel_options.ParallelConfig`  strategy, dp x tp x pp, schedule, buckets, nodes
    zero        `zero_options.ZeroConfig`          ZeRO++, ZeRO-3's prefetch, offloading
    compress    `compress_options.CompressConfig`  gradient compression on the dp reduction
    ps          `ps_options.ServerConfig`          a parameter server's servers and consistency
    checkpoint  `checkpoint_options.CheckpointConfig`  saves, resume, initial weights
    faults      `fault_options.FaultConfig`        injected faults, restarts, stragglers
    trace       `trace_options.TraceConfig`        timeline traces and torch.profiler of some steps

Each section checks its own fields as it is built; `TrainConfig` then checks what needs several
(`_check` and each option module's `check`). A field is also known by its flat name, the one the
command line and the JSON config use (`--steps`, `--offload-params`; the model preset is `model`):
`TrainConfig(strategy="zero3", steps=10)` builds the sections, and `dataclasses.replace(cfg,
steps=20)` changes one field.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ringzero.plan.config import PRECISIONS, RECOMPUTES
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.placement import Placement
from ringzero.plan.strategies.sharding import Strategy
from ringzero.run import checkpoint_options, compress_options, fault_options, ps_options, trace_options, zero_options
from ringzero.run.checkpoint_options import CheckpointConfig
from ringzero.run.compress_options import CompressConfig
from ringzero.run.fault_options import FaultConfig
from ringzero.run.precision_options import LossScalerConfig
from ringzero.run.fields import FieldError
from ringzero.run.gpt_shape import ATTENTIONS
from ringzero.run.kind import RunKind
from ringzero.run.model_options import TRAINABLE, ModelConfig
from ringzero.run.optim_options import LR_SCHEDULES, OptimConfig
from ringzero.run.parallel_options import ALGORITHMS, STRATEGIES, TRANSPORTS, ParallelConfig
from ringzero.run.ps_options import ServerConfig
from ringzero.run.trace_options import TraceConfig
from ringzero.run.training_options import TrainingConfig
from ringzero.run.zero_options import ZeroConfig

SECTIONS: dict[str, type] = {"model": ModelConfig, "training": TrainingConfig, "optim": OptimConfig,
                             "parallel": ParallelConfig, "zero": ZeroConfig, "compress": CompressConfig, "ps": ServerConfig,
                             "checkpoint": CheckpointConfig, "faults": FaultConfig, "trace": TraceConfig}


@functools.cache
def flat_fields() -> dict[str, tuple[str, dataclasses.Field]]:
    """Every field by its flat name: (its section, the field)."""
    out = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            out["model" if (section, f.name) == ("model", "name") else f.name] = section, f
    return out


@functools.cache
def choices() -> dict[str, tuple[str, ...]]:
    """The values each enumerated field accepts: what the sections validate against and what the
    command line offers (this module imports no torch, so `ringzero train` answers fast)."""
    return {"strategy": STRATEGIES, "schedule": pipeline.SCHEDULES, "precision": PRECISIONS,
            "recompute": RECOMPUTES, "attention": ATTENTIONS, "comm_algorithm": ALGORITHMS,
            "offload_optimizer": zero_options.OFFLOADS, "offload_params": zero_options.OFFLOADS,
            "ps_mode": ps_options.MODES, "model": TRAINABLE, "compress": compress_options.SCHEMES,
            "transport": TRANSPORTS, "lr_schedule": tuple(LR_SCHEDULES)}


@dataclass(frozen=True, init=False)
class TrainConfig:
    model: ModelConfig
    training: TrainingConfig
    optim: OptimConfig
    parallel: ParallelConfig
    zero: ZeroConfig
    compress: CompressConfig
    ps: ServerConfig
    checkpoint: CheckpointConfig
    faults: FaultConfig
    trace: TraceConfig

    def __init__(self, **given) -> None:
        """Sections by name, fields by their flat names, or both (a flat name wins over its section's
        value); what is not given takes its default."""
        sections = {s: given.pop(s) for s in SECTIONS if isinstance(given.get(s), SECTIONS[s])}
        changes: dict[str, dict] = {s: {} for s in SECTIONS}
        known = flat_fields()
        for name, value in given.items():
            if name not in known:
                raise TypeError(f"TrainConfig got an unexpected keyword argument {name!r}")
            section, f = known[name]
            changes[section][f.name] = value
        for s, cls in SECTIONS.items():
            base = sections.get(s)
            value = cls(**changes[s]) if base is None else dataclasses.replace(base, **changes[s])
            object.__setattr__(self, s, value)
        self._check()

    def _check(self) -> None:
        """What needs several sections: the model against the tp ranks and the pipeline, then each
        option module's own (`zero_options`, `compress_options`, `ps_options`, `checkpoint_options`, `fault_options`)."""
        self._check_tensor_parallel()
        self._check_pipeline()
        zero_options.check(self)
        compress_options.check(self)
        ps_options.check(self)
        checkpoint_options.check(self)
        fault_options.check(self)
        trace_options.check(self)

    def _check_pipeline(self) -> None:
        p, t = self.parallel, self.training
        try:
            pipeline.check(p.pp, self.shape.layers, t.grad_accum, p.schedule, p.virtual_stages)
        except ValueError as e:
            field = "schedule" if p.schedule not in pipeline.SCHEDULES else \
                "virtual_stages" if p.virtual_stages > 1 else "pp"
            raise FieldError(field, str(e).replace("micro-batches", "micro-batches (grad_accum)")) from None
        if p.pp > 1 and (self.kind is RunKind.SINGLE or self.sharding.reduces_every_micro_batch):
            raise FieldError("strategy", f"strategy {p.strategy!r} cannot run under pipeline parallelism: "
                                         "ZeRO-2/3 reduce (and ZeRO-3 gathers) every micro-batch, m times a "
                                         "step's traffic under a pipeline, so, as DeepSpeed's pipeline engine, "
                                         "ringzero takes dp or zero1 with pp > 1")
        if p.pipeline_cost is not None and p.pp == 1:
            raise FieldError("pipeline_cost", "synthetic pipeline costs need pp > 1")

    def _check_tensor_parallel(self) -> None:
        m, p = self.shape, self.parallel
        t = p.tp
        for what, n in (("heads", m.heads), ("kv heads", m.kv), ("MLP width", m.ffn_dim)):
            if n % t:
                raise FieldError("tp", f"tp={t} does not divide the {what} ({n}) of model {self.model.name!r}; "
                                       f"tp must divide {m.heads} heads and the MLP width {m.ffn_dim}")
        if p.sequence_parallel and t == 1:
            raise FieldError("sequence_parallel", "sequence parallelism needs tp > 1 (it splits the "
                                                  "tensor-parallel ranks' sequence)")
        if p.sequence_parallel and m.seq % t:
            raise FieldError("sequence_parallel", f"sequence parallelism needs the sequence ({m.seq}) to be a "
                                                  f"multiple of tp={t}")
        if self.kind is RunKind.SINGLE and t > 1:
            raise FieldError("strategy", "strategy 'single' runs on one rank; with tp > 1 use dp or zero1-3")

    def flat(self) -> dict:
        """Every field by its flat name: the config as the command line and reports write it."""
        return {name: getattr(getattr(self, s), f.name) for name, (s, f) in flat_fields().items()}

    @classmethod
    def from_dict(cls, data: dict, **changes) -> "TrainConfig":
        """The configuration `as_dict` wrote (a report's, a checkpoint's), with `changes` (flat
        fields) applied: the loss scaler's dict and JSON's lists become the fields' own types."""
        fields = {}
        for k, v in {**data, **changes}.items():
            if k == "loss_scaler" and isinstance(v, dict):
                v = LossScalerConfig(**v)
            fields[k] = tuple(v) if isinstance(v, list) else v
        return cls(**fields)

    def as_dict(self) -> dict:
        """`flat`, as plain data (the loss scaler's settings a dict): what reports and checkpoints hold."""
        return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in self.flat().items()}

    # -- what the whole run derives, each written once in its section ---------------------------
    @property
    def kind(self) -> RunKind:
        return self.parallel.kind

    @property
    def sharding(self) -> Strategy:
        return self.parallel.sharding

    @property
    def shape(self) -> ModelShape:
        return self.model.shape

    @property
    def value_bytes(self) -> int:
        return self.optim.value_bytes

    def placement(self, world: int) -> Placement:
        return self.parallel.placement(world)

    def global_batch(self, world: int) -> int:
        """Sequences per optimizer step on `world` ranks (the tp ranks and pipeline stages of a dp
        rank share its batch)."""
        t, p = self.training, self.parallel
        return t.micro_batch * t.grad_accum * (world // (p.tp * p.pp))

    def lr_at(self, step: int) -> float:
        return self.optim.lr_at(step, self.training.steps)
