"""What is trained and how it is split: the planner's typed, validated inputs (besides the model
shape and the hardware).

`Training` is the step (micro-batch, global batch, tokens, precision, optimizer); `Parallel` the rank
grid and the memory techniques (ZeRO, Rajbhandari et al. 2020; tensor and pipeline parallelism,
Shoeybi et al. 2019 and Narayanan et al. 2021). Both are frozen and reject an unsupported value with a
one-line error naming what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.comm.algorithms import AUTO, names
from ringzero.plan.pipeline.schedule import SCHEDULES
from ringzero.plan.placement import Placement
from ringzero.plan.model.presets import recipe
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.strategies.tensor_parallel import REPLAYS

PRECISIONS = ("fp32", "bf16", "fp16")
VALUE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes of one weight, gradient or activation value in each precision (IEEE 754 binary32 and
binary16; bfloat16 keeps fp32's 8-bit exponent in 16 bits). The fp32 master copy and the optimizer
moments of mixed precision are fp32 (Micikevicius et al. 2018; Rajbhandari et al. 2020 §3.1)."""
OPTIMIZERS = ("adam", "sgd-momentum")
OFFLOADS = ("none", "cpu", "nvme")
RECOMPUTES = ("none", "selective", "full")
DP_ALGORITHMS = (AUTO,) + names("all_reduce")


CUSTOM_DROPOUT = True
"""Dropout of a model that is not a preset: on, as GPT-2 and GPT-3 train (and as Korthikanti et al.
2022 count the activations), so that an unknown recipe is not planned too small."""


def default_dropout(name: str) -> bool:
    """The one default of `Training.dropout`, for the Python API and `ringzero plan` alike: the
    preset `name`'s recipe (`presets.RECIPES`: none for LLaMA), else CUSTOM_DROPOUT."""
    try:
        return recipe(name).dropout
    except ValueError:                   # not a preset ("custom", or a name of the caller's own)
        return CUSTOM_DROPOUT


def _choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what}={value!r} is not supported; allowed: {', '.join(allowed)}")


def value_bytes(precision: str) -> int:
    """Bytes of one value in `precision` (`VALUE_BYTES`); a one-line error for any other name."""
    _choice("precision", precision, PRECISIONS)
    return VALUE_BYTES[precision]


@dataclass(frozen=True, kw_only=True)
class Training:
    """One optimizer step: how many sequences, in what precision, with which optimizer."""

    micro_batch: int = 1
    """Sequences per GPU per forward/backward pass (b)."""
    global_batch: int | None = None
    """Sequences per optimizer step over all data-parallel ranks (None: micro_batch x dp, i.e. no
    gradient accumulation). Must be a multiple of micro_batch x dp."""
    tokens: float | None = None
    """Training tokens D for the totals (FLOPs, days); None: 20 per parameter (Chinchilla)."""
    precision: str = "bf16"
    """"fp32", or "bf16"/"fp16": 16-bit parameters and gradients with fp32 master weights and
    optimizer moments (Rajbhandari et al. 2020 §3.1: 2 + 2 + 12 bytes per parameter with Adam)."""
    optimizer: str = "adam"
    """"adam" (two fp32 moments) or "sgd-momentum" (one)."""
    dropout: bool | None = None
    """Dropout in attention and after each block (its masks are activations, Korthikanti et al.);
    None: the model's own training recipe (`default_dropout`), as `ringzero plan` without
    --dropout/--no-dropout. Read it as `dropout_for(model)`."""

    def __post_init__(self) -> None:
        if self.micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {self.micro_batch}")
        if self.global_batch is not None and self.global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {self.global_batch}")
        if self.tokens is not None and not self.tokens > 0:
            raise ValueError(f"tokens must be > 0, got {self.tokens}")
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.dropout is not None and not isinstance(self.dropout, bool):
            raise ValueError(f"dropout must be true, false or None (the model's recipe), got {self.dropout!r}")

    def dropout_for(self, model: ModelShape) -> bool:
        """Whether `model` is trained with dropout: the field, or when None the model's recipe."""
        return self.dropout if self.dropout is not None else default_dropout(model.name)

    @property
    def bytes_per_value(self) -> int:
        """Bytes of one parameter, gradient or activation element in compute precision."""
        return value_bytes(self.precision)

    def sequences_per_step(self, dp: int) -> int:
        return self.global_batch or self.micro_batch * dp

    def accumulation(self, dp: int) -> int:
        """Micro-batches each data-parallel rank runs per step (the pipeline's m)."""
        per_rank = self.micro_batch * dp
        if self.sequences_per_step(dp) % per_rank:
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of "
                             f"micro_batch x dp = {self.micro_batch} x {dp}")
        return self.sequences_per_step(dp) // per_rank


@dataclass(frozen=True, kw_only=True)
class Parallel:
    """The rank grid dp x tp x pp and the memory techniques applied to it."""

    dp: int = 1
    """Data-parallel ranks (the ZeRO sharding degree N_d)."""
    tp: int = 1
    """Tensor-parallel ranks (Megatron-LM column/row split; Shoeybi et al. 2019 §3)."""
    pp: int = 1
    """Pipeline stages (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2021 §2.2)."""
    zero: int = 0
    """ZeRO stage 0-3 over the data-parallel group (Rajbhandari et al. 2020 §5)."""
    offload: str = "none"
    """Where the optimizer states live: "none" (GPU), "cpu" (ZeRO-Offload), "nvme" (ZeRO-Infinity)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout split over the tp ranks (needs tp > 1)."""
    schedule: str = "1f1b"
    """Pipeline schedule (`plan.pipeline.schedule`): "gpipe" (all micro-batches in flight), "1f1b" (at most
    pp) or "interleaved" (1F1B over `virtual_stages` model chunks per rank: a bubble v times
    smaller for more activations on the first stages and v times the point-to-point messages)."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (Narayanan et al. 2021 §2.2.2); > 1 only with "interleaved"."""
    recompute: str = "none"
    """Activation recomputation: "none", "selective" (attention core) or "full" (whole block)."""
    recompute_replay: str = "whole"
    """How full recomputation re-runs a block (`plan.strategies.tensor_parallel.REPLAYS`): "whole", as
    Megatron-LM does, repeating its two tensor-parallel reductions (6 per layer), or "early-stop",
    as torch's non-reentrant checkpoint (ringzero's engine) does, stopping before the last (5)."""
    flash_attention: bool = False
    """Fused attention: the s x s scores are never stored (Dao et al. 2022)."""
    dp_algorithm: str = "auto"
    """All-reduce algorithm of the gradient sync ("auto": the cheapest under the α-β model)."""
    bucket_mb: float = 25.0
    """Gradient bucket size in MiB (DDP's default is 25)."""
    prefetch: int = 1
    """ZeRO-3: layers gathered ahead of the one computing (FSDP's forward prefetch: 1)."""

    def __post_init__(self) -> None:
        for k in ("dp", "tp", "pp"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero={self.zero!r} is not supported; allowed: 0, 1, 2, 3")
        _choice("offload", self.offload, OFFLOADS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("recompute", self.recompute, RECOMPUTES)
        _choice("recompute_replay", self.recompute_replay, REPLAYS)
        _choice("dp_algorithm", self.dp_algorithm, DP_ALGORITHMS)
        if self.offload != "none" and self.zero == 0:
            raise ValueError(f"offload={self.offload!r} needs zero >= 1 (ZeRO-Offload shards the optimizer)")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        self._check_pipeline()
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {self.bucket_mb}")
        if type(self.prefetch) is not int or self.prefetch < 0:
            raise ValueError(f"prefetch must be an integer >= 0, got {self.prefetch!r}")

    def _check_pipeline(self) -> None:
        v = self.virtual_stages
        if type(v) is not int or v < 1:
            raise ValueError(f"virtual_stages must be an integer >= 1, got {v!r}")
        if v > 1 and self.schedule != "interleaved":
            raise ValueError(f"virtual_stages={v} needs schedule 'interleaved', not {self.schedule!r}")
        if self.schedule == "interleaved" and self.pp == 1:
            raise ValueError("schedule='interleaved' needs pp > 1 (it interleaves the stages' model chunks)")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def placement(self, ranks_per_node: int | None = None) -> Placement:
        """Where each rank of this grid sits (Megatron's order: tp, then dp, then pp)."""
        return Placement(dp=self.dp, tp=self.tp, pp=self.pp, ranks_per_node=ranks_per_node)
