"""What one training run does: a frozen, validated config (read from DeepSpeed JSON by `deepspeed.py`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from ringzero.comm import registry
from ringzero.plan.config import PRECISIONS, RECOMPUTES, value_bytes
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.strategies import sharding
from ringzero.plan.placement import Placement
from ringzero.plan.model.presets import MODELS
from ringzero.plan.model.presets import model as preset
from ringzero.plan.model.shapes import ModelShape
from ringzero.run import fault_options
from ringzero.run.fields import FieldError  # noqa: F401 (the error of every field, importable with the config)
from ringzero.run.gpt_shape import ATTENTIONS, check_shape, trainable
from ringzero.run.kind import RunKind, kind_of, sharding_of
from ringzero.plan.strategies.sharding import Strategy
from ringzero.run import checkpoint_options
from ringzero.run import precision_options
from ringzero.run import ps_options
from ringzero.run import zero_options
from ringzero.run.precision_options import LossScalerConfig

STRATEGIES = ("single", *sharding.STRATEGIES, "ps")
"""`plan.strategies.sharding`'s data-parallel strategies, "single": DP on one rank, and "ps": a parameter
server (`ps_options`)."""


@functools.cache
def choices() -> dict[str, tuple[str, ...]]:
    """The values each enumerated field accepts: what `TrainConfig` validates against and what the
    command line offers (this module imports no torch, so `ringzero train` answers fast)."""
    return {"strategy": STRATEGIES, "schedule": pipeline.SCHEDULES, "precision": PRECISIONS,
            "recompute": RECOMPUTES, "attention": ATTENTIONS,
            "comm_algorithm": registry.SPECIAL + registry.algorithms("all_reduce"),
            "offload_optimizer": zero_options.OFFLOADS, "offload_params": zero_options.OFFLOADS,
            "ps_mode": ps_options.MODES,
            "model": tuple(name for name, shape in MODELS.items() if trainable(shape))}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str = "nano"
    """Model preset (ringzero's own GPTs: nano, micro; or gpt2, which is slow on a CPU)."""
    seq: int | None = None
    """Sequence length (None: the preset's)."""
    layers: int | None = None
    """Number of blocks (None: the preset's)."""
    attention: str = "eager"
    """"eager" (materialises the s x s scores) or "sdpa" (torch's fused attention)."""
    dropout: float = 0.0
    strategy: str = "dp"
    """single, dp, zero1, zero2 or zero3."""
    precision: str = "fp32"
    recompute: str = "none"
    steps: int = 100
    micro_batch: int = 8
    """Sequences per rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (communication only on the last, for dp and zero1)."""
    lr: float = 3e-3
    warmup: int = 10
    """Linear warm-up steps, then cosine decay to lr/10 at the last step."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    clip: float | None = 1.0
    """Global gradient-norm clipping (None: off)."""
    bucket_mb: float = 1.0
    comm_algorithm: str = "auto"
    eval_every: int = 25
    eval_batches: int = 4
    seed: int = 0
    data: str | None = None
    """Text file or folder; None: the Python standard library's sources."""
    max_bytes: int = 4 * 2**20
    log_every: int | None = None
    """Print a plain log line every N steps; None: every 10 % of the run when stdout is not a terminal."""
    tp: int = 1
    """Tensor-parallel ranks (Megatron-LM's column/row split; must divide the heads and the MLP width)."""
    dp: int | None = None
    """Data-parallel ranks (None: the ranks / tp)."""
    sequence_parallel: bool = False
    """Split LayerNorm and dropout along the sequence over the tp ranks (Korthikanti et al. 2022)."""
    pp: int = 1
    """Pipeline stages (the micro-batches of a step are the pipeline's m = grad_accum)."""
    schedule: str = "1f1b"
    """Pipeline schedule: gpipe, 1f1b or interleaved (`plan.pipeline.schedule`)."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (the interleaved schedule's v)."""
    pipeline_cost: tuple[float, float] | None = None
    """Synthetic costs: a stage's forward and backward of one micro-batch last at least these
    seconds (padded by a sleep), so the schedule, not the shared cores, sets the timing."""

    ranks_per_node: int | None = None
    """Emulated nodes of this many consecutive ranks (None: one node): where ZeRO++'s blocks fall,
    which bytes the meter calls cross-node, and which messages `emulate_inter_node` delays."""
    emulate_inter_node: tuple[float, float] | None = None
    """(GB/s, latency µs) of an emulated inter-node link: every cross-node message is delayed so
    (`comm.link_emulator`); None: no delay."""
    zeropp: tuple[str, ...] = ()
    """ZeRO++ options on ZeRO-3, any of qwz, hpz, qgz (`plan.strategies.zeropp`)."""
    hpz_partition: int | None = None
    """dp ranks per ZeRO++ block (None: the dp ranks in one node; DeepSpeed's zero_hpz_partition_size)."""
    qgz_bits: int = 4
    """qgZ's gradient bits: 4 or 8."""
    offload_optimizer: str = "none"
    """Where the optimizer states and fp32 masters live: none, cpu (ZeRO-Offload) or nvme (ZeRO-Infinity)."""
    offload_params: str = "none"
    """ZeRO-3 only: where the weight shards live between uses: none, cpu or nvme."""
    nvme_path: str | None = None
    """Folder of the swap files for nvme offload."""
    offload_buffers: int = 4
    """Swap buffers streaming NVMe-offloaded states through the update."""
    offload_pin_memory: bool = True
    """Page-lock the host copies when a GPU is present (faster copies; no effect on a CPU)."""
    servers: int = 0
    """strategy ps: server ranks, on top of the workers (`ps_options`)."""
    ps_mode: str = "sync"
    """strategy ps: sync (BSP), async, or ssp (bounded staleness)."""
    staleness: int = 0
    """ps_mode ssp: steps the fastest worker may run ahead of the slowest."""
    straggler: tuple[int, float] | None = None
    """(rank, factor): that worker's compute takes factor times as long (a sleep of the difference)."""
    save_dir: str | None = None
    """Folder of checkpoints (`ringzero.checkpoint`); None: none are written."""
    save_every: int | None = None
    """Save after every this many steps (and after the last); None: after the last only."""
    keep: int | None = None
    """Complete checkpoints kept under save_dir (the newest); None: all."""
    async_save: bool = False
    """Write checkpoints on a background thread: the step waits only for the copy to host memory."""
    resume: str | None = None
    """A checkpoint (its folder, or a save_dir: its latest) to continue from, in any layout."""
    overwrite: bool = False
    """Start in a save_dir that holds another run's checkpoints, retiring those at or after this
    run's saves (without it such a run is refused: a run only removes its own lineage's)."""
    inject_nonfinite: tuple[int, int] | None = None
    """(rank, step): put an inf into that rank's gradient at that step (a fault, on purpose)."""
    inject_kill: tuple[int, int] | None = None
    """(rank, step): that rank SIGKILLs itself as that step begins (a fault; a restart runs without it)."""
    max_restarts: int = 0
    """Restart the whole job from the latest checkpoint under save_dir when a rank fails, at most this
    many times (torchrun's elastic agent does the same)."""
    max_nonfinite: int = 3
    """Stop after this many steps in a row whose gradients were not finite (bf16, fp32; fp16 backs
    its loss scale off instead)."""
    init_from: str | None = None
    """A consolidated safetensors file (`ringzero checkpoint consolidate`) to take the weights from."""
    loss_scaler: LossScalerConfig = LossScalerConfig()
    """fp16's loss scaling: static or dynamic, its start, window, hysteresis and floor (`precision_options`)."""

    def __post_init__(self) -> None:
        allowed = choices()
        for name in ("strategy", "schedule", "precision", "recompute", "attention", "comm_algorithm", "ps_mode"):
            if getattr(self, name) not in allowed[name]:
                raise FieldError(name, f"{name} {getattr(self, name)!r} is not supported; "
                                       f"allowed: {', '.join(allowed[name])}")
        for name in ("steps", "micro_batch", "grad_accum", "eval_every", "eval_batches", "max_bytes"):
            _check(self, name, lambda v: v >= 1, "must be >= 1", integer=True)
        for name in ("seq", "log_every", "layers"):
            _check(self, name, lambda v: v >= 1, "must be >= 1", integer=True, optional=True)
        _check(self, "warmup", lambda v: v >= 0, "must be >= 0", integer=True)
        for name in ("lr", "eps", "bucket_mb"):
            _check(self, name, lambda v: math.isfinite(v) and v > 0, "must be > 0")
        _check(self, "weight_decay", lambda v: math.isfinite(v) and v >= 0, "must be >= 0")
        _check(self, "clip", lambda v: math.isfinite(v) and v > 0, "must be > 0 (or None: off)", optional=True)
        _check(self, "dropout", lambda v: 0 <= v < 1, "must be in [0, 1)")
        _check(self, "betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "must be two numbers in [0, 1)")
        check_shape(self.shape)
        self._check_tensor_parallel()
        self._check_pipeline()
        zero_options.check(self)
        ps_options.check(self)
        checkpoint_options.check(self)
        fault_options.check(self)
        precision_options.check(self)

    def _check_pipeline(self) -> None:
        _check(self, "pp", lambda v: v >= 1, "must be >= 1", integer=True)
        _check(self, "virtual_stages", lambda v: v >= 1, "must be >= 1", integer=True)
        _check(self, "pipeline_cost", lambda v: len(v) == 2 and all(math.isfinite(c) and c >= 0 for c in v),
               "must be two seconds >= 0 (forward, backward)", optional=True)
        try:
            pipeline.check(self.pp, self.shape.layers, self.grad_accum, self.schedule, self.virtual_stages)
        except ValueError as e:
            field = "schedule" if self.schedule not in pipeline.SCHEDULES else \
                "virtual_stages" if self.virtual_stages > 1 else "pp"
            raise FieldError(field, str(e).replace("micro-batches", "micro-batches (grad_accum)")) from None
        if self.pp > 1 and (self.kind is RunKind.SINGLE or self.sharding.reduces_every_micro_batch):
            raise FieldError("strategy", f"strategy {self.strategy!r} cannot run under pipeline parallelism: "
                                         "ZeRO-2/3 reduce (and ZeRO-3 gathers) every micro-batch, m times a "
                                         "step's traffic under a pipeline, so, as DeepSpeed's pipeline engine, "
                                         "ringzero takes dp or zero1 with pp > 1")
        if self.pipeline_cost is not None and self.pp == 1:
            raise FieldError("pipeline_cost", "synthetic pipeline costs need pp > 1")

    def _check_tensor_parallel(self) -> None:
        _check(self, "tp", lambda v: v >= 1, "must be >= 1", integer=True)
        _check(self, "dp", lambda v: v >= 1, "must be >= 1", integer=True, optional=True)
        if not isinstance(self.sequence_parallel, bool):
            raise FieldError("sequence_parallel", f"sequence_parallel must be true or false, got "
                                                  f"{self.sequence_parallel!r}")
        m, t = self.shape, self.tp
        for what, n in (("heads", m.heads), ("kv heads", m.kv), ("MLP width", m.ffn_dim)):
            if n % t:
                raise FieldError("tp", f"tp={t} does not divide the {what} ({n}) of model {self.model!r}; "
                                       f"tp must divide {m.heads} heads and the MLP width {m.ffn_dim}")
        if self.sequence_parallel and t == 1:
            raise FieldError("sequence_parallel", "sequence parallelism needs tp > 1 (it splits the "
                                                  "tensor-parallel ranks' sequence)")
        if self.sequence_parallel and m.seq % t:
            raise FieldError("sequence_parallel", f"sequence parallelism needs the sequence ({m.seq}) to be a "
                                                  f"multiple of tp={t}")
        if self.kind is RunKind.SINGLE and t > 1:
            raise FieldError("strategy", "strategy 'single' runs on one rank; with tp > 1 use dp or zero1-3")

    @property
    def kind(self) -> RunKind:
        """One rank, a grid, or a parameter server (`run.kind`)."""
        return kind_of(self.strategy)

    @property
    def sharding(self) -> Strategy:
        """The data-parallel strategy's table (`plan.strategies.sharding`; DP's outside a grid)."""
        return sharding_of(self.strategy)

    @property
    def tp_algorithm(self) -> str:
        """The algorithm of the tensor-parallel collectives: the run's, unless sequence parallelism
        needs an all-gather or reduce-scatter it does not implement (then the ring)."""
        algo = self.comm_algorithm
        if not self.sequence_parallel or algo in registry.SPECIAL:
            return algo
        ok = all(algo in registry.algorithms(c) for c in ("all_gather", "reduce_scatter"))
        return algo if ok else "ring"

    def placement(self, world: int) -> Placement:
        """The dp x tp x pp grid of this run on `world` ranks, or a one-line FieldError."""
        model_parallel = self.tp * self.pp
        what = "tp" if self.pp == 1 else "pp" if self.tp == 1 else "tp x pp"
        if model_parallel > world:
            raise FieldError(what.split()[-1], f"{what}={model_parallel} is larger than the {world} ranks")
        if self.dp is None and world % model_parallel:
            raise FieldError(what.split()[-1], f"{what}={model_parallel} does not divide the {world} ranks")
        dp = self.dp if self.dp is not None else world // model_parallel
        if dp * model_parallel != world:
            grid = f"dp x tp = {dp} x {self.tp}" if self.pp == 1 else f"dp x tp x pp = {dp} x {self.tp} x {self.pp}"
            raise FieldError("dp" if self.dp is not None else "tp",
                             f"{grid} = {dp * model_parallel} must equal the {world} ranks")
        if self.ranks_per_node is not None and world % self.ranks_per_node:
            raise FieldError("ranks_per_node", f"ranks_per_node={self.ranks_per_node} does not divide the "
                                               f"{world} ranks; nodes hold equal numbers of ranks")
        return Placement(dp=dp, tp=self.tp, pp=self.pp, ranks_per_node=self.ranks_per_node)

    @property
    def value_bytes(self) -> int:
        """Bytes of one weight, gradient or activation value in the training precision."""
        return value_bytes(self.precision)

    @property
    def shape(self) -> ModelShape:
        m = preset(self.model)
        changes = {k: v for k, v in (("seq", self.seq), ("layers", self.layers)) if v is not None}
        return dataclasses.replace(m, **changes) if changes else m

    def global_batch(self, world: int) -> int:
        """Sequences per optimizer step on `world` ranks (the tp ranks and pipeline stages of a dp
        rank share its batch)."""
        return self.micro_batch * self.grad_accum * (world // (self.tp * self.pp))

    def lr_at(self, step: int) -> float:
        """Linear warm-up then cosine decay to lr/10 (GPT-3's schedule, Brown et al. 2020 §B)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _check(cfg: TrainConfig, name: str, ok, rule: str, integer: bool = False, optional: bool = False) -> None:
    """Raise "NAME RULE, got VALUE" unless ok(value); with `integer`, a non-integer (or a bool) is
    "NAME must be an integer"; with `optional`, None passes."""
    value = getattr(cfg, name)
    if optional and value is None:
        return
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise FieldError(name, f"{name} must be an integer, got {value!r}")
    try:
        good = ok(value)
    except TypeError:
        good = False
    if not good:
        raise FieldError(name, f"{name} {rule}, got {value!r}")
