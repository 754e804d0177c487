"""Reading a DeepSpeed JSON config into a `TrainConfig` (docs/deepspeed.md lists every key).

A key sets a field (`deepspeed_sections`, `deepspeed_schedule`), or only tunes DeepSpeed's own
implementation (accepted, with one warning line on stderr saying why it has no effect here), or is
refused in one line: an unknown key (the closest known one suggested), or one asking for what
ringzero does not have (`deepspeed_keys`). The batch follows DeepSpeed: train_batch_size = micro
batch x accumulation x data-parallel ranks, the missing one derived. Explicit overrides (the
command line's flags) win over the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from ringzero.json_input import unique_keys
from ringzero.plan.strategies.compression import refusal
from ringzero.run.deepspeed import schedule
from ringzero.run.config import FieldError, TrainConfig
from ringzero.run.deepspeed.sections import Reader, communication, optimizer, precision, zero
from ringzero.run.optim_options import OptimConfig


def read_json(path: str, what: str = "config file"):
    """The JSON value in file `path`, or a one-line ValueError naming the file and what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=unique_keys)
    except FileNotFoundError:
        raise ValueError(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path!r} is a folder; give a JSON file") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                         f"offset {exc.start}); give a JSON file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path!r} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:       # json's decoder recurses once per nested list or object
        raise ValueError(f"{what} {path!r} nests lists or objects too deeply to read "
                         f"(the limit is about {sys.getrecursionlimit()} levels)") from None
    except ValueError as exc:
        raise ValueError(f"{what} {path!r}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None


def _settings(r: Reader, ds: dict) -> None:
    """Every section of `ds`, read into `r` (each key checked for its JSON type)."""
    r.check_keys(ds, "")
    for key, field, kind in (("train_micro_batch_size_per_gpu", "micro_batch", int),
                             ("gradient_accumulation_steps", "grad_accum", int),
                             ("steps_per_print", "log_every", int), ("gradient_clipping", "clip", float)):
        r.put(field, r.number(ds, key, kind, key), key)
    if "clip" in r.kw:
        r.kw["clip"] = r.kw["clip"] or None          # DeepSpeed: 0 turns clipping off
    batch = r.number(ds, "train_batch_size", int, "train_batch_size")
    if batch is not None and batch < 1:
        raise ValueError(f"train_batch_size must be >= 1, got {batch}")
    r.later["train_batch_size"] = batch
    zero(r, r.section(ds, "zero_optimization"))
    r.put("tp", r.number(r.section(ds, "tensor_parallel"), "autotp_size", int, "tensor_parallel.autotp_size"),
          "tensor_parallel.autotp_size")
    precision(r, ds)
    communication(r, ds)
    if "optimizer" in ds:
        optimizer(r, r.section(ds, "optimizer"))
    if "scheduler" in ds:                            # after the optimizer: its peak lr wins, as in DeepSpeed
        schedule.scheduler(r, r.section(ds, "scheduler"))
    else:
        schedule.no_scheduler(r)


def _communication(r: Reader, overrides: dict) -> None:
    """communication_data_type -> compress. DeepSpeed casts the gradients to it for their reduction:
    a 16-bit type other than the training precision is ringzero's cast of the gradient buckets
    (compress=fp16/bf16, `plan.strategies.compression`); the training precision itself asks for
    nothing, and fp32 under 16-bit training has no effect here. DeepSpeed casts from the first step,
    so the cast starts at step 0 (unless --compress-start says otherwise); a --compress flag wins."""
    v = r.later.get("communication_data_type")
    train = overrides.get("precision") or r.kw.get("precision", OptimConfig.precision)
    if v is None or "compress" in overrides or v == train:
        return
    if v == "fp32":
        r.note(f"communication_data_type fp32 has no effect here: ringzero reduces the gradients in the training "
               f"precision ({train})")
        return
    strategy = overrides.get("strategy") or r.kw.get("strategy", "dp")
    why = refusal(v, strategy)
    if why:
        r.note(f"communication_data_type {v} has no effect here: compress={v} {why}")
        return
    r.put("compress", v, "communication_data_type")
    if "compress_start" not in overrides:
        r.put("compress_start", 0, "communication_data_type")


def _built(path: str, r: Reader, overrides: dict, make) -> TrainConfig:
    """make(), with a field the file set and TrainConfig refuses reported with the key it came from."""
    try:
        return make()
    except FieldError as exc:
        if exc.field in r.source and exc.field not in overrides:
            raise ValueError(f"{r.source[exc.field]} in {path!r}: {exc}") from None
        raise


def _batch(path: str, r: Reader, cfg: TrainConfig, world: int, overrides: dict) -> TrainConfig:
    """DeepSpeed's rule: train_batch_size = micro x accumulation x dp; given two, derive the third;
    given train_batch_size alone, no accumulation. Refuse a triple that does not add up."""
    batch = r.later["train_batch_size"]
    if batch is None:
        return cfg
    dp = max(1, world // (cfg.parallel.tp * cfg.parallel.pp))
    name = {f: f"--{f.replace('_', '-')}" if f in overrides else r.source.get(f) for f in ("micro_batch", "grad_accum")}
    ranks = f"{dp} data-parallel rank{'s' if dp > 1 else ''}"
    if name["micro_batch"] and name["grad_accum"]:
        total = cfg.training.micro_batch * cfg.training.grad_accum * dp
        if total != batch:
            raise ValueError(f"train_batch_size={batch} != {name['micro_batch']} {cfg.training.micro_batch} x "
                             f"{name['grad_accum']} {cfg.training.grad_accum} x {ranks} = {total}")
        return cfg
    if name["micro_batch"]:
        field, per, what = "grad_accum", cfg.training.micro_batch * dp, f"{name['micro_batch']} {cfg.training.micro_batch} x {ranks}"
    else:
        accum = cfg.training.grad_accum if name["grad_accum"] else 1
        field, per = "micro_batch", accum * dp
        what = f"{name['grad_accum'] or 'gradient_accumulation_steps (default)'} {accum} x {ranks}"
    if batch % per:
        raise ValueError(f"train_batch_size={batch} is not a multiple of {what} = {per}")
    r.source[field] = "train_batch_size"
    return _built(path, r, {}, lambda: dataclasses.replace(cfg, **{field: batch // per}))


def _bucket(path: str, r: Reader, cfg: TrainConfig, overrides: dict) -> TrainConfig:
    """reduce_bucket_size (elements) -> bucket_mb (MiB of gradients in the training precision):
    DP's all-reduce and ZeRO-1/2's reduce-scatter buckets, which ZeRO-1/2 also all-gather the
    updated shards in (so allgather_bucket_size is that size too, when it is the only one given)."""
    reduce_n, gather_n = r.later.get("reduce_bucket_size"), r.later.get("allgather_bucket_size")
    if cfg.sharding.shard_params:
        for key in ("reduce_bucket_size", "allgather_bucket_size"):
            if r.later.get(key) is not None:
                r.note(f"zero_optimization.{key} has no effect here: ringzero's ZeRO-3 reduces and gathers one "
                       "layer per bucket")
        return cfg
    gathers = cfg.sharding.gathers_after_step
    if gather_n is not None and not gathers:
        r.note(f"zero_optimization.allgather_bucket_size has no effect here: strategy {cfg.parallel.strategy} gathers nothing")
    if gathers and None not in (reduce_n, gather_n) and reduce_n != gather_n:
        r.note(f"zero_optimization.allgather_bucket_size {gather_n} differs from reduce_bucket_size {reduce_n}: "
               f"ringzero's ZeRO-1/2 all-gather in the gradient buckets, so {reduce_n} elements is used for both")
    n, key = (reduce_n, "reduce_bucket_size") if reduce_n is not None else (gather_n if gathers else None,
                                                                          "allgather_bucket_size")
    if n is None or "bucket_mb" in overrides:
        return cfg
    r.source["bucket_mb"] = f"zero_optimization.{key}"
    return _built(path, r, {}, lambda: dataclasses.replace(cfg, bucket_mb=n * cfg.value_bytes / 2**20))


def _late_notes(r: Reader, cfg: TrainConfig) -> None:
    """The warnings that need the run's final settings (the command line's included)."""
    unused = r.later.get("scaler_keys")
    if unused and cfg.optim.precision != "fp16":
        r.note(f"{', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect here: this run trains in "
               f"{cfg.optim.precision}, without loss scaling")
    if "scheduler" in r.later:
        line = schedule.schedule_note(*r.later["scheduler"], cfg.training.steps, cfg.optim.lr_schedule)
        if line:
            r.note(line)


def _stderr(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":          # under torchrun every rank reads the file: say it once
        print(f"ringzero: {line}", file=sys.stderr, flush=True)


def from_deepspeed(path: str, world: int, *, say=_stderr, **overrides) -> TrainConfig:
    """Read a DeepSpeed JSON config on `world` ranks; explicit `overrides` win. `say` gets the
    warning lines (keys with no effect here) and the note on "auto" values, once the file is known
    to be valid."""
    ds = read_json(path)
    if not isinstance(ds, dict):
        raise ValueError(f"config file {path!r} must hold a JSON object, got {type(ds).__name__}")
    r = Reader()
    _settings(r, ds)
    _communication(r, overrides)
    cfg = _built(path, r, overrides, lambda: TrainConfig(**{**r.kw, **overrides}))
    cfg = _bucket(path, r, _batch(path, r, cfg, world, overrides), overrides)
    _late_notes(r, cfg)
    for line in r.notes:
        say(f"warning: {path}: {line}")
    if r.auto:
        say(f"note: {path}: \"auto\" takes ringzero's flag or default (as HF Trainer fills it from its own "
            f"arguments) for {', '.join(r.auto)}")
    return cfg
