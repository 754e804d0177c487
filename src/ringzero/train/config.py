"""What one training run does: a frozen, validated config, and the DeepSpeed JSON it can be read from."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass

from ..comm import registry
from ..plan.config import PRECISIONS, RECOMPUTES
from ..plan.placement import Placement
from ..plan.presets import MODELS
from ..plan.presets import model as preset
from ..plan.shapes import ModelShape

STRATEGIES = ("single", "dp", "zero1", "zero2", "zero3")
ATTENTIONS = ("eager", "sdpa")
"""eager materialises the s x s scores; sdpa is torch's scaled_dot_product_attention."""


def check_shape(m: ModelShape) -> None:
    """ringzero's GPT has learned positions, LayerNorm, an ungated MLP, tied embeddings and MHA."""
    wrong = [f"{k}={getattr(m, k)!r}" for k, ok in (("positions", m.positions == "learned"),
             ("norm", m.norm == "layernorm"), ("gated", not m.gated), ("tied", m.tied),
             ("kv_heads", m.kv == m.heads)) if not ok]
    if wrong:
        raise ValueError(f"ringzero's GPT cannot take {', '.join(wrong)}: it has learned positions, "
                         "LayerNorm, a GELU MLP, tied embeddings and multi-head attention")


def _trainable(shape: ModelShape) -> bool:
    try:
        check_shape(shape)
        return True
    except ValueError:
        return False


class FieldError(ValueError):
    """A field of `TrainConfig` holds a value it cannot take; `.field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@functools.cache
def choices() -> dict[str, tuple[str, ...]]:
    """The values each enumerated field accepts: what `TrainConfig` validates against and what the
    command line offers (this module imports no torch, so `ringzero train` answers fast)."""
    return {"strategy": STRATEGIES, "precision": PRECISIONS, "recompute": RECOMPUTES, "attention": ATTENTIONS,
            "comm_algorithm": registry.SPECIAL + registry.algorithms("all_reduce"),
            "model": tuple(name for name, shape in MODELS.items() if _trainable(shape))}


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
    log_every: int | None = None
    """Print a plain log line every N steps; None: every 10 % of the run when stdout is not a terminal."""
    tp: int = 1
    """Tensor-parallel ranks (Megatron-LM's column/row split; must divide the heads and the MLP width)."""
    dp: int | None = None
    """Data-parallel ranks (None: the ranks / tp)."""
    sequence_parallel: bool = False
    """Split LayerNorm and dropout along the sequence over the tp ranks (Korthikanti et al. 2022)."""

    def __post_init__(self) -> None:
        allowed = choices()
        for name in ("strategy", "precision", "recompute", "attention", "comm_algorithm"):
            if getattr(self, name) not in allowed[name]:
                raise FieldError(name, f"{name} {getattr(self, name)!r} is not supported; "
                                       f"allowed: {', '.join(allowed[name])}")
        for name in ("steps", "micro_batch", "grad_accum", "eval_every", "eval_batches", "max_bytes"):
            _check(self, name, lambda v: v >= 1, "must be >= 1", integer=True)
        for name in ("seq", "log_every"):
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
        if self.strategy == "single" and t > 1:
            raise FieldError("strategy", "strategy 'single' runs on one rank; with tp > 1 use dp or zero1-3")

    def placement(self, world: int) -> Placement:
        """The dp x tp grid of this run on `world` ranks, or a one-line FieldError."""
        if self.tp > world:
            raise FieldError("tp", f"tp={self.tp} is larger than the {world} ranks")
        if self.dp is None and world % self.tp:
            raise FieldError("tp", f"tp={self.tp} does not divide the {world} ranks")
        dp = self.dp if self.dp is not None else world // self.tp
        if dp * self.tp != world:
            raise FieldError("dp" if self.dp is not None else "tp",
                             f"dp x tp = {dp} x {self.tp} = {dp * self.tp} must equal the {world} ranks")
        return Placement(dp=dp, tp=self.tp)

    @property
    def shape(self) -> ModelShape:
        m = preset(self.model)
        return dataclasses.replace(m, seq=self.seq) if self.seq is not None else m

    def global_batch(self, world: int) -> int:
        """Sequences per optimizer step on `world` ranks (the tp ranks of a dp rank share its batch)."""
        return self.micro_batch * self.grad_accum * (world // self.tp)

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


def _number(v, kind: type, name: str):
    """JSON value `v` of key `name` as `kind`, or one clear line saying what is wrong (bools,
    fractions of ints and the non-finite NaN/Infinity that Python's json accepts are refused)."""
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
          and (kind is float or float(v).is_integer()))
    if not ok:
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a finite number'}, got {v!r}")
    return kind(v)


def _flag(d: dict, key: str, name: str) -> bool:
    """d[key] as a JSON boolean ("false" and "yes" are strings, not booleans); missing: False."""
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be true or false, got {v!r}")
    return v


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
                  "zero_optimization", "fp16", "bf16", "optimizer", "train_batch_size", "steps_per_print",
                  "tensor_parallel")
SOURCE = {"micro_batch": "train_micro_batch_size_per_gpu", "grad_accum": "gradient_accumulation_steps",
          "clip": "gradient_clipping", "log_every": "steps_per_print", "strategy": "zero_optimization.stage",
          "tp": "tensor_parallel.autotp_size",
          "precision": "fp16/bf16.enabled", **{k: f"optimizer.params.{k}" for k in ("lr", "betas", "eps",
                                                                                       "weight_decay")}}
"""TrainConfig field -> the DeepSpeed key it is read from (named in a validation error)."""


def _unique(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"key {twice[0]!r} appears more than once in one object")
    return dict(pairs)


def read_json(path: str, what: str = "config file"):
    """The JSON value in file `path`, or a one-line ValueError naming the file and what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=_unique)
    except FileNotFoundError:
        raise ValueError(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path!r} is a folder; give a JSON file") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                         f"offset {exc.start}); give a JSON file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path!r} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except ValueError as exc:
        raise ValueError(f"{what} {path!r}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None


def _settings(ds: dict) -> dict:
    """The TrainConfig fields a DeepSpeed config sets (each key checked for its JSON type)."""
    kw: dict = {}
    for key, field, kind in (("train_micro_batch_size_per_gpu", "micro_batch", int),
                             ("gradient_accumulation_steps", "grad_accum", int),
                             ("steps_per_print", "log_every", int), ("gradient_clipping", "clip", float)):
        if key in ds:
            kw[field] = _number(ds[key], kind, key)
    if "clip" in kw:
        kw["clip"] = kw["clip"] or None          # DeepSpeed: 0 turns clipping off
    zero = _section(ds, "zero_optimization", {"stage"})
    if "stage" in zero:
        stage = _number(zero["stage"], int, "zero_optimization.stage")
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage={stage}; allowed: 0, 1, 2, 3")
        kw["strategy"] = "dp" if stage == 0 else f"zero{stage}"
    tp = _section(ds, "tensor_parallel", {"autotp_size"})
    if "autotp_size" in tp:
        kw["tp"] = _number(tp["autotp_size"], int, "tensor_parallel.autotp_size")
    enabled = [name for name in ("fp16", "bf16")
               if _flag(_section(ds, name, {"enabled"}), "enabled", f"{name}.enabled")]
    if len(enabled) == 2:
        raise ValueError("fp16.enabled and bf16.enabled are both true; enable at most one")
    if enabled:
        kw["precision"] = enabled[0]
    if "optimizer" in ds:
        kw.update(_optimizer(_section(ds, "optimizer", {"type", "params"})))
    return kw


def _optimizer(opt: dict) -> dict:
    kind = opt.get("type", "adam")
    if not isinstance(kind, str) or kind.lower() not in ("adam", "adamw"):
        raise ValueError(f"optimizer.type={kind!r}; allowed: Adam, AdamW")
    kw: dict = {}
    params = _section(opt, "params", {"lr", "betas", "eps", "weight_decay"}, "optimizer.params")
    for k, v in params.items():
        if k == "betas":
            if not isinstance(v, list) or len(v) != 2:
                raise ValueError(f"optimizer.params.betas must be a list of two numbers, got {v!r}")
            kw[k] = tuple(_number(x, float, f"optimizer.params.betas[{i}]") for i, x in enumerate(v))
        else:
            kw[k] = _number(v, float, f"optimizer.params.{k}")
    return kw


def from_deepspeed(path: str, world: int, **overrides) -> TrainConfig:
    """Read a DeepSpeed-style JSON config (the keys of `DEEPSPEED_KEYS`); explicit `overrides` win.

    Every key is checked for its JSON type (a boolean must be true or false, a count an integer),
    and a value TrainConfig refuses is reported with the key it came from."""
    ds = read_json(path)
    if not isinstance(ds, dict):
        raise ValueError(f"config file {path!r} must hold a JSON object, got {type(ds).__name__}")
    unknown = sorted(set(ds) - set(DEEPSPEED_KEYS))
    if unknown:
        raise ValueError(f"unsupported DeepSpeed config keys {unknown}; supported: {', '.join(DEEPSPEED_KEYS)}")
    from_file = _settings(ds)
    try:
        cfg = TrainConfig(**{**from_file, **overrides})
    except FieldError as exc:
        field = exc.field
        if field in from_file and field not in overrides:
            raise ValueError(f"{SOURCE[field]} in {path!r}: {exc}") from None
        raise
    if "train_batch_size" in ds:
        batch = _number(ds["train_batch_size"], int, "train_batch_size")
        if batch != cfg.global_batch(world):
            raise ValueError(f"train_batch_size={batch} != micro batch x accumulation x ranks = "
                             f"{cfg.global_batch(world)}")
    return cfg
