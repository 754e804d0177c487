"""What one training run does: a frozen, validated config, and the DeepSpeed JSON it can be read from."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from ..comm import registry
from ..parallel.precision import DTYPES
from ..parallel.recompute import MODES
from ..plan.presets import model as preset
from ..plan.shapes import ModelShape
from .model import ATTENTIONS, check_shape

STRATEGIES = ("single", "dp", "zero1", "zero2", "zero3")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str = "nano"
    """Model preset (ringzero's own GPTs: nano, micro; or gpt2, which is slow on a CPU)."""
    seq: int | None = None
    """Sequence length (None: the preset's)."""
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

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(msg)
        if self.strategy not in STRATEGIES:
            bad(f"unknown strategy {self.strategy!r}; allowed: {', '.join(STRATEGIES)}")
        if self.precision not in DTYPES:
            bad(f"precision={self.precision!r}; allowed: {', '.join(DTYPES)}")
        if self.recompute not in MODES:
            bad(f"recompute={self.recompute!r}; allowed: {', '.join(MODES)}")
        if self.attention not in ATTENTIONS:
            bad(f"attention={self.attention!r}; allowed: {', '.join(ATTENTIONS)}")
        for k in ("steps", "micro_batch", "grad_accum", "eval_every", "eval_batches", "max_bytes"):
            if getattr(self, k) < 1:
                bad(f"{k} must be >= 1, got {getattr(self, k)}")
        if not 0 <= self.dropout < 1:
            bad(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.lr > 0 or self.warmup < 0 or self.weight_decay < 0:
            bad("lr must be > 0, warmup and weight_decay >= 0")
        if self.clip is not None and not self.clip > 0:
            bad(f"clip must be > 0, got {self.clip}")
        if not self.bucket_mb > 0:
            bad(f"bucket_mb must be > 0, got {self.bucket_mb}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            bad(f"betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            bad(f"eps must be > 0, got {self.eps}")
        if self.seq is not None and self.seq < 1:
            bad(f"seq must be >= 1, got {self.seq}")
        registry.check_name("all_reduce", self.comm_algorithm)
        check_shape(self.shape)

    @property
    def shape(self) -> ModelShape:
        m = preset(self.model)
        return dataclasses.replace(m, seq=self.seq) if self.seq is not None else m

    def global_batch(self, dp: int) -> int:
        return self.micro_batch * self.grad_accum * dp

    def lr_at(self, step: int) -> float:
        """Linear warm-up then cosine decay to lr/10 (GPT-3's schedule, Brown et al. 2020 §B)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _number(d: dict, key: str, kind: type, name: str | None = None):
    """d[key] as `kind`, or one clear line saying what is wrong (bools and fractions of ints refused)."""
    v = d[key]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or float(v).is_integer())
    if not ok:
        raise ValueError(f"{name or key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    return kind(v)


def _section(d: dict, key: str, allowed: set[str], name: str | None = None) -> dict:
    """d[key] as a JSON object with only `allowed` keys (missing: empty)."""
    v = d.get(key, {})
    if not isinstance(v, dict):
        raise ValueError(f"{name or key} must be a JSON object, got {v!r}")
    extra = sorted(set(v) - allowed)
    if extra:
        raise ValueError(f"unsupported {name or key} keys {extra}; supported: {', '.join(sorted(allowed))}")
    return v


# DeepSpeed key -> what it sets (ringzero accepts these and rejects the rest by name).
DEEPSPEED_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
                  "zero_optimization", "fp16", "bf16", "optimizer", "train_batch_size", "steps_per_print")


def from_deepspeed(path: str, world: int, **overrides) -> TrainConfig:
    """Read a DeepSpeed-style JSON config (the keys of `DEEPSPEED_KEYS`); explicit `overrides` win."""
    try:
        with open(path) as f:
            ds = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file {path!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"config file {path!r} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(ds, dict):
        raise ValueError(f"config file {path!r} must hold a JSON object, got {type(ds).__name__}")
    unknown = sorted(set(ds) - set(DEEPSPEED_KEYS))
    if unknown:
        raise ValueError(f"unsupported DeepSpeed config keys {unknown}; supported: {', '.join(DEEPSPEED_KEYS)}")
    kw: dict = {}
    if "train_micro_batch_size_per_gpu" in ds:
        kw["micro_batch"] = _number(ds, "train_micro_batch_size_per_gpu", int)
    if "gradient_accumulation_steps" in ds:
        kw["grad_accum"] = _number(ds, "gradient_accumulation_steps", int)
    if "gradient_clipping" in ds:
        kw["clip"] = _number(ds, "gradient_clipping", float) or None
    zero = _section(ds, "zero_optimization", {"stage"})
    if "stage" in zero:
        stage = _number(zero, "stage", int, "zero_optimization.stage")
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage={stage}; allowed: 0, 1, 2, 3")
        kw["strategy"] = "dp" if stage == 0 else f"zero{stage}"
    enabled = [name for name in ("fp16", "bf16") if _section(ds, name, {"enabled"}).get("enabled")]
    if len(enabled) == 2:
        raise ValueError("fp16.enabled and bf16.enabled are both true; enable at most one")
    if enabled:
        kw["precision"] = enabled[0]
    opt = _section(ds, "optimizer", {"type", "params"}) if "optimizer" in ds else None
    if opt is not None:
        if str(opt.get("type", "adam")).lower() not in ("adam", "adamw"):
            raise ValueError(f"optimizer.type={opt.get('type')!r}; allowed: Adam, AdamW")
        params = _section(opt, "params", {"lr", "betas", "eps", "weight_decay"}, "optimizer.params")
        for k, v in params.items():
            if k == "betas":
                if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, (int, float)) for x in v):
                    raise ValueError(f"optimizer.params.betas must be a list of two numbers, got {v!r}")
                kw[k] = tuple(float(x) for x in v)
            else:
                kw[k] = _number(params, k, float, f"optimizer.params.{k}")
    kw.update(overrides)
    cfg = TrainConfig(**kw)
    if "train_batch_size" in ds and ds["train_batch_size"] != cfg.global_batch(world):
        raise ValueError(f"train_batch_size={ds['train_batch_size']} != micro batch x accumulation x "
                         f"ranks = {cfg.global_batch(world)}")
    return cfg
