"""Reading a DeepSpeed-style JSON config into a `TrainConfig` (the keys ringzero runs; every other
key is refused by name, every value checked for its JSON type)."""

from __future__ import annotations

import json
import math

from .config import FieldError, TrainConfig


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
          "tp": "tensor_parallel.autotp_size", "offload_optimizer": "zero_optimization.offload_optimizer.device",
          "offload_params": "zero_optimization.offload_param.device", "nvme_path": "zero_optimization.*.nvme_path",
          "offload_buffers": "zero_optimization.*.buffer_count", "offload_pin_memory": "offload_optimizer.pin_memory",
          "zeropp": "zero_optimization.zero_quantized_*", "hpz_partition": "zero_optimization.zero_hpz_partition_size",
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
    kw.update(_zero(_section(ds, "zero_optimization", ZERO_KEYS)))
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


ZERO_KEYS = {"stage", "offload_optimizer", "offload_param", "zero_quantized_weights", "zero_hpz_partition_size",
             "zero_quantized_gradients"}


def _zero(zero: dict) -> dict:
    """zero_optimization: the stage, ZeRO-Offload/Infinity's sections and ZeRO++'s three keys."""
    kw: dict = {}
    if "stage" in zero:
        stage = _number(zero["stage"], int, "zero_optimization.stage")
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage={stage}; allowed: 0, 1, 2, 3")
        kw["strategy"] = "dp" if stage == 0 else f"zero{stage}"
    for key, field, extra in (("offload_optimizer", "offload_optimizer", {"pin_memory"}), ("offload_param", "offload_params", set())):
        name = f"zero_optimization.{key}"
        sec = _section(zero, key, {"device", "nvme_path", "buffer_count"} | extra, name)
        if "device" in sec:
            kw[field] = sec["device"] if isinstance(sec["device"], str) else repr(sec["device"])
        if "nvme_path" in sec:
            _same(kw, "nvme_path", sec["nvme_path"] if isinstance(sec["nvme_path"], str) else repr(sec["nvme_path"]), name)
        if "buffer_count" in sec:
            _same(kw, "offload_buffers", _number(sec["buffer_count"], int, f"{name}.buffer_count"), name)
        if "pin_memory" in sec:
            kw["offload_pin_memory"] = _flag(sec, "pin_memory", f"{name}.pin_memory")
    zpp = [o for o, key in (("qwz", "zero_quantized_weights"), ("qgz", "zero_quantized_gradients"))
           if _flag(zero, key, f"zero_optimization.{key}")]
    if "zero_hpz_partition_size" in zero:
        size = _number(zero["zero_hpz_partition_size"], int, "zero_optimization.zero_hpz_partition_size")
        if size < 1:
            raise ValueError(f"zero_optimization.zero_hpz_partition_size must be >= 1, got {size}")
        if size > 1:                               # DeepSpeed: 1 (the default) is hpZ off
            zpp.append("hpz")
            kw["hpz_partition"] = size
    if zpp:
        kw["zeropp"] = tuple(zpp)
    return kw


def _same(kw: dict, field: str, value, name: str) -> None:
    """Set kw[field], refusing a second, different value (ringzero has one swap folder and one pool)."""
    if kw.get(field, value) != value:
        raise ValueError(f"{name}: {field.replace('offload_buffers', 'buffer_count')} {value!r} differs from "
                         f"the other offload section's {kw[field]!r}; ringzero uses one for both")
    kw[field] = value


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
