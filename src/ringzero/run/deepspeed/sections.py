"""Reading the sections of a DeepSpeed config: typed values, "auto", and one warning line per key
that has no effect here (`deepspeed_keys` says which keys are which).

"auto" (what HF Trainer writes, then fills from its own arguments) takes ringzero's command-line
flag or default, the same way. Every other value must have its JSON type.
"""

from __future__ import annotations

import dataclasses
import math

from ringzero.run.deepspeed import keys
from ringzero.run.precision_options import DEEPSPEED, ScalerError


class Reader:
    """One config's walk: the fields it sets (and the key each came from), the "auto" keys, the
    warning lines, and the checks that need the built TrainConfig (`later`)."""

    def __init__(self) -> None:
        self.kw: dict = {}
        self.source: dict[str, str] = {}
        self.auto: list[str] = []
        self.notes: list[str] = []
        self.later: dict = {}

    def put(self, field: str, value, name: str) -> None:
        if value is not None:
            self.kw[field], self.source[field] = value, name

    def note(self, line: str) -> None:
        self.notes.append(line)

    def check_keys(self, d: dict, section: str) -> None:
        """Refuse an unknown key (suggesting the closest) or a REFUSED one that is on; note TUNING ones."""
        for k, v in d.items():
            name = keys.path(section, k)
            if k not in keys.known(section):
                raise ValueError(keys.unknown(section, k))
            if name in keys.REFUSED and not keys.is_off(name, v):
                raise ValueError(f"{name}={v!r} is not supported: {keys.REFUSED[name]}")
            if name in keys.TUNING and not (name in keys.QUIET_WHEN_OFF and keys.is_off(name, v)):
                self.note(f"{name} has no effect here: {keys.TUNING[name]}")

    def section(self, d: dict, key: str, section: str | None = None) -> dict:
        """d[key] as a JSON object (missing: empty), its keys checked as `section`'s."""
        name = section or key
        v = d.get(key, {})
        if not isinstance(v, dict):
            raise ValueError(f"{name} must be a JSON object, got {v!r}")
        self.check_keys(v, name)
        return v

    def number(self, d: dict, key: str, kind: type, name: str):
        """d[key] as `kind`; None when missing or "auto". Bools, fractions of ints and the
        non-finite NaN/Infinity that Python's json accepts are refused in one line."""
        if key not in d or self.is_auto(d[key], name):
            return None
        return self.value(d[key], kind, name)

    @staticmethod
    def value(v, kind: type, name: str):
        """`v` as `kind`, or one line naming `name` and what it must be."""
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (kind is float or float(v).is_integer()))
        if not ok:
            raise ValueError(f"{name} must be {'an integer' if kind is int else 'a finite number'}, got {v!r}")
        return kind(v)

    def flag(self, d: dict, key: str, name: str) -> bool | None:
        """d[key] as a JSON boolean ("false" and "yes" are strings, not booleans); None when missing or "auto"."""
        if key not in d or self.is_auto(d[key], name):
            return None
        if not isinstance(d[key], bool):
            raise ValueError(f"{name} must be true or false, got {d[key]!r}")
        return d[key]

    def is_auto(self, v, name: str) -> bool:
        if v == "auto":
            self.auto.append(name)
            return True
        return False


def zero(r: Reader, z: dict) -> None:
    """zero_optimization: the stage, the bucket sizes, ZeRO-Offload/Infinity's sections, ZeRO++'s keys."""
    stage = r.number(z, "stage", int, "zero_optimization.stage")
    if stage is not None:
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage={stage}; allowed: 0, 1, 2, 3")
        r.put("strategy", "dp" if stage == 0 else f"zero{stage}", "zero_optimization.stage")
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        n = r.number(z, key, int, f"zero_optimization.{key}")
        if n is not None:
            r.later[key] = n
    for key, field in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        _offload(r, r.section(z, key, f"zero_optimization.{key}"), field, f"zero_optimization.{key}")
    zpp = [o for o, key in (("qwz", "zero_quantized_weights"), ("qgz", "zero_quantized_gradients"))
           if r.flag(z, key, f"zero_optimization.{key}")]
    size = r.number(z, "zero_hpz_partition_size", int, "zero_optimization.zero_hpz_partition_size")
    if size is not None and size < 1:
        raise ValueError(f"zero_optimization.zero_hpz_partition_size must be >= 1, got {size}")
    if size is not None and size > 1:                  # DeepSpeed: 1 (the default) is hpZ off
        zpp.append("hpz")
        r.put("hpz_partition", size, "zero_optimization.zero_hpz_partition_size")
    if zpp:
        r.put("zeropp", tuple(zpp), "zero_optimization.zero_quantized_*")


def _text(v) -> str:
    """A string as itself, anything else as its repr (TrainConfig then names it as not allowed)."""
    return v if isinstance(v, str) else repr(v)


def _offload(r: Reader, sec: dict, field: str, name: str) -> None:
    """One offload section: where its states live, and the swap settings the two sections share."""
    if "device" in sec:
        r.put(field, _text(sec["device"]), f"{name}.device")
    if "nvme_path" in sec:
        _same(r, "nvme_path", _text(sec["nvme_path"]), name, "nvme_path")
    count = r.number(sec, "buffer_count", int, f"{name}.buffer_count")
    pin = r.flag(sec, "pin_memory", f"{name}.pin_memory")
    for shared, key, v in (("offload_buffers", "buffer_count", count), ("offload_pin_memory", "pin_memory", pin)):
        if v is not None:
            _same(r, shared, v, name, key)


def _same(r: Reader, field: str, value, name: str, key: str) -> None:
    """Set `field` from one offload section; ringzero has one swap folder, one buffer pool and one
    pinning for both sections. A second folder is refused (it may be another drive, whose space the
    run would need); a second count or pinning is warned about, and the optimizer section's kept."""
    first = r.kw.get(field, value)
    if first != value and field == "nvme_path":
        raise ValueError(f"{name}.nvme_path {value!r} differs from the other offload section's {first!r}; "
                         f"ringzero swaps both into one folder")
    if first != value:
        r.note(f"{name}.{key} {value!r} is not used: ringzero has one {key} for both offload sections, "
               f"the optimizer's {first!r}")
        return
    r.put(field, value, f"{name}.{key}")


SCALER_KEYS = {"loss_scale": "loss_scale", "initial_scale_power": "initial_scale_power",
               "loss_scale_window": "window", "hysteresis": "hysteresis", "min_loss_scale": "min_scale",
               "consecutive_hysteresis": "consecutive_hysteresis"}
"""fp16 key -> `LossScalerConfig` field."""


def precision(r: Reader, ds: dict) -> None:
    """fp16 / bf16 (or its alias bfloat16): which one is on, and fp16's loss scaler."""
    if "bf16" in ds and "bfloat16" in ds:
        raise ValueError("bf16 and bfloat16 are the same section in DeepSpeed; give one")
    bf16_key = "bfloat16" if "bfloat16" in ds else "bf16"
    fp16, bf16 = r.section(ds, "fp16"), r.section(ds, bf16_key, "bf16")
    on = [name for name, sec in (("fp16", fp16), ("bf16", bf16)) if r.flag(sec, "enabled", f"{name}.enabled")]
    if len(on) == 2:
        raise ValueError("fp16.enabled and bf16.enabled are both true; enable at most one")
    if on:
        r.put("precision", on[0], f"{on[0]}.enabled")
    if fp16.get("enabled") is False:
        return                                          # DeepSpeed reads no scaler keys then either
    given = {}
    for key, field in SCALER_KEYS.items():
        kind = bool if key == "consecutive_hysteresis" else float if key in ("loss_scale", "min_loss_scale") else int
        v = r.flag(fp16, key, f"fp16.{key}") if kind is bool else r.number(fp16, key, kind, f"fp16.{key}")
        if v is not None:
            given[field] = v
    if not given and "fp16" not in ds:
        return
    try:
        scaler = dataclasses.replace(DEEPSPEED, **given)
    except ScalerError as exc:
        key = next(k for k, f in SCALER_KEYS.items() if f == exc.field)
        raise ValueError(f"fp16.{key}: {exc}") from None
    r.put("loss_scaler", scaler, "fp16")
    r.later["scaler_keys"] = [f"fp16.{k}" for k, f in SCALER_KEYS.items() if f in given]


COMMUNICATION_TYPES = ("fp16", "bf16", "fp32")
"""DeepSpeed's `communication_data_type` values (it lowercases them; null: the training precision)."""


def communication(r: Reader, ds: dict) -> None:
    """communication_data_type: the dtype DeepSpeed reduces gradients in, kept for `reader` to map
    once the training precision is known."""
    v = ds.get("communication_data_type")
    if v is None or r.is_auto(v, "communication_data_type"):
        return
    if not isinstance(v, str) or v.lower() not in COMMUNICATION_TYPES:
        raise ValueError(f"communication_data_type={v!r}; allowed: {', '.join(COMMUNICATION_TYPES)}")
    r.later["communication_data_type"] = v.lower()


def optimizer(r: Reader, opt: dict) -> None:
    """optimizer: Adam or AdamW (ringzero's is AdamW: decoupled weight decay, bias-corrected moments)."""
    kind = opt.get("type", "adam")
    if not isinstance(kind, str) or kind.lower() not in ("adam", "adamw"):
        raise ValueError(f"optimizer.type={kind!r}; allowed: Adam, AdamW")
    params = r.section(opt, "params", "optimizer.params")
    for k in ("lr", "eps", "weight_decay"):
        r.put(k, r.number(params, k, float, f"optimizer.params.{k}"), f"optimizer.params.{k}")
    if "betas" in params and params["betas"] != "auto":
        v = params["betas"]
        if not isinstance(v, list) or len(v) != 2:
            raise ValueError(f"optimizer.params.betas must be a list of two numbers, got {v!r}")
        r.put("betas", tuple(r.value(x, float, f"optimizer.params.betas[{i}]") for i, x in enumerate(v)),
              "optimizer.params.betas")
    elif "betas" in params:
        r.auto.append("optimizer.params.betas")
    # DeepSpeed's "Adam" is AdamW unless adam_w_mode is false: then weight decay is L2 in the gradient.
    if kind.lower() == "adam" and r.flag(params, "adam_w_mode", "optimizer.params.adam_w_mode") is False \
            and r.kw.get("weight_decay"):
        raise ValueError("optimizer.params.adam_w_mode=false with weight_decay is Adam with L2 regularisation; "
                         "ringzero's Adam decays the weights decoupled (AdamW): drop adam_w_mode or weight_decay")
    if r.flag(params, "bias_correction", "optimizer.params.bias_correction") is False:
        raise ValueError("optimizer.params.bias_correction=false is not supported: ringzero's Adam always "
                         "corrects the moments' bias")

