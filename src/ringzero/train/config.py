"""What one training run does: a frozen, validated config, and the DeepSpeed JSON it can be read from."""

from __future__ import annotations

import dataclasses
import json
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
        registry.check_name("all_reduce", self.comm_algorithm)
        check_shape(self.shape)

    @property
    def shape(self) -> ModelShape:
        m = preset(self.model)
        return dataclasses.replace(m, seq=self.seq) if self.seq else m

    def global_batch(self, dp: int) -> int:
        return self.micro_batch * self.grad_accum * dp

    def lr_at(self, step: int) -> float:
        """Linear warm-up then cosine decay to lr/10 (GPT-3's schedule, Brown et al. 2020 §B)."""
        import math
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


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
    unknown = sorted(set(ds) - set(DEEPSPEED_KEYS))
    if unknown:
        raise ValueError(f"unsupported DeepSpeed config keys {unknown}; supported: {', '.join(DEEPSPEED_KEYS)}")
    kw: dict = {}
    if "train_micro_batch_size_per_gpu" in ds:
        kw["micro_batch"] = int(ds["train_micro_batch_size_per_gpu"])
    if "gradient_accumulation_steps" in ds:
        kw["grad_accum"] = int(ds["gradient_accumulation_steps"])
    if "gradient_clipping" in ds:
        kw["clip"] = float(ds["gradient_clipping"]) or None
    zero = ds.get("zero_optimization", {})
    extra = sorted(set(zero) - {"stage"})
    if extra:
        raise ValueError(f"unsupported zero_optimization keys {extra}; supported: stage")
    if "stage" in zero:
        stage = int(zero["stage"])
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage={stage}; allowed: 0, 1, 2, 3")
        kw["strategy"] = "dp" if stage == 0 else f"zero{stage}"
    for name in ("fp16", "bf16"):
        sub = ds.get(name, {})
        if sorted(set(sub) - {"enabled"}):
            raise ValueError(f"unsupported {name} keys {sorted(set(sub) - {'enabled'})}; supported: enabled")
        if sub.get("enabled"):
            kw["precision"] = name
    opt = ds.get("optimizer")
    if opt is not None:
        if str(opt.get("type", "adam")).lower() not in ("adam", "adamw"):
            raise ValueError(f"optimizer.type={opt.get('type')!r}; allowed: Adam, AdamW")
        params = opt.get("params", {})
        if sorted(set(params) - {"lr", "betas", "eps", "weight_decay"}):
            raise ValueError(f"unsupported optimizer.params {sorted(set(params) - {'lr', 'betas', 'eps', 'weight_decay'})}; "
                             "supported: lr, betas, eps, weight_decay")
        kw.update({k: (tuple(v) if k == "betas" else float(v)) for k, v in params.items()})
    kw.update(overrides)
    cfg = TrainConfig(**kw)
    if "train_batch_size" in ds and ds["train_batch_size"] != cfg.global_batch(world):
        raise ValueError(f"train_batch_size={ds['train_batch_size']} != micro batch x accumulation x "
                         f"ranks = {cfg.global_batch(world)}")
    return cfg
