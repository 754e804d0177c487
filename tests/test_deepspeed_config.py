"""A real DeepSpeed config works: every key is mapped, warned about (one line: it only tunes
DeepSpeed's implementation) or refused in one line (unknown keys with the closest known one).

The fixtures under fixtures/deepspeed/ have the shapes of public DeepSpeed configs (DeepSpeedExamples'
HelloDeepSpeed, bing_bert ZeRO-2, Megatron-GPT2 ZeRO-2 and ZeRO-3, ZeRO-Infinity on NVMe, and an HF
Trainer ZeRO-3 config full of "auto"). The fp16 section sets the loss scaler (its semantics:
test_loss_scaler.py); one real 2-rank run shows the mapped bucket size and scaler reach the ranks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ringzero import cli
from ringzero.commands import train as train_cmd
from ringzero.run.deepspeed import keys
from ringzero.run.config import FieldError, TrainConfig
from ringzero.run.deepspeed.reader import from_deepspeed
from ringzero.run.precision_options import DEEPSPEED, LossScalerConfig

FIXTURES = Path(__file__).parent / "fixtures" / "deepspeed"
DOCS = Path(__file__).parent.parent / "docs" / "deepspeed.md"
MiB = 2**20


def _read(tmp_path, ds, world: int = 2, **overrides):
    """(TrainConfig, warned keys, all lines) of config `ds` (a fixture's name or a dict) on `world` ranks."""
    if isinstance(ds, dict):
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(ds))
    else:
        path = FIXTURES / ds
    lines: list[str] = []
    cfg = from_deepspeed(str(path), world, say=lines.append, **overrides)
    warned = [re.split(r"[ ,:]", line.split(f"{path}: ", 1)[1])[0] for line in lines if line.startswith("warning:")]
    return cfg, warned, lines


def _refused(tmp_path, ds, *words, world: int = 2, **overrides) -> str:
    with pytest.raises(ValueError) as err:
        _read(tmp_path, ds, world, **overrides)
    line = str(err.value)
    assert "\n" not in line
    for w in words:
        assert w in line, (w, line)
    return line


def _nested(dotted: str, value) -> dict:
    out = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


# -- the fixtures: real shapes --------------------------------------------------------------------

def test_hello_deepspeed(tmp_path):
    cfg, warned, lines = _read(tmp_path, "hello_deepspeed.json")
    assert (cfg.parallel.strategy, cfg.optim.precision, cfg.training.micro_batch, cfg.optim.lr, cfg.zero.offload_optimizer) == \
        ("zero1", "fp16", 8, 1e-4, "cpu")
    assert cfg.optim.loss_scaler == DEEPSPEED == LossScalerConfig(window=1000, hysteresis=2)   # DeepSpeed's defaults
    assert lines == []


def test_bing_bert_zero2(tmp_path):
    _refused(tmp_path, "bing_bert_zero2.json", "optimizer.params.bias_correction=false", "always corrects")
    ds = json.loads((FIXTURES / "bing_bert_zero2.json").read_text())
    del ds["optimizer"]["params"]["bias_correction"]
    cfg, warned, _ = _read(tmp_path, ds)
    # 4096 sequences = 64 per rank x 2 ranks x 32 micro-batches
    assert (cfg.training.micro_batch, cfg.training.grad_accum, cfg.global_batch(2)) == (64, 32, 4096)
    assert (cfg.parallel.strategy, cfg.optim.precision, cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.clip, cfg.training.log_every) == \
        ("zero2", "fp16", 4e-4, 0.01, 1.0, 1000)
    assert cfg.parallel.bucket_mb == 5e8 * 2 / MiB                   # elements of fp16 gradients
    assert sorted(warned) == sorted(f"zero_optimization.{k}" for k in (
        "allgather_partitions", "reduce_scatter", "overlap_comm", "contiguous_gradients"))


def test_megatron_gpt2_zero2(tmp_path):
    cfg, warned, _ = _read(tmp_path, "megatron_gpt2_zero2.json")
    assert (cfg.training.micro_batch, cfg.training.grad_accum) == (4, 1)       # 8 = micro x 1 x 2 ranks
    assert (cfg.optim.betas, cfg.optim.lr, cfg.parallel.bucket_mb, cfg.training.log_every) == ((0.9, 0.95), 1.5e-4, 5e7 * 2 / MiB, 1)
    assert cfg.optim.loss_scaler == LossScalerConfig(window=1000, hysteresis=2, min_scale=1.0)
    # wall_clock_breakdown is on; zero_allow_untested_optimizer and cpu_offload are off: no line.
    assert "wall_clock_breakdown" in warned and "zero_allow_untested_optimizer" not in warned
    assert not any("cpu_offload" in w for w in warned)


def test_megatron_gpt2_zero3_with_warmup_and_activation_checkpointing(tmp_path):
    cfg, warned, lines = _read(tmp_path, "megatron_gpt2_zero3.json", steps=50)
    assert (cfg.parallel.strategy, cfg.training.micro_batch, cfg.training.grad_accum, cfg.optim.warmup, cfg.optim.lr) == ("zero3", 4, 2, 20, 6e-4)
    assert cfg.optim.loss_scaler.initial_scale == 2.0**12 and cfg.optim.loss_scaler.hysteresis == 2
    assert cfg.parallel.bucket_mb == TrainConfig().parallel.bucket_mb             # ZeRO-3 buckets are layers
    for key in ("activation_checkpointing", "zero_optimization.reduce_bucket_size",
                "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.offload_optimizer.pipeline_read",
                "scheduler"):
        assert warned.count(key) == 1, (key, warned)
    sched = next(line for line in lines if "scheduler WarmupLR" in line)
    assert "logarithmically" in sched and "holds the peak" not in sched         # ringzero holds it too
    assert cfg.optim.lr_schedule == "constant" and cfg.lr_at(49) == cfg.optim.lr


def test_zero_infinity_nvme(tmp_path):
    ds = json.loads((FIXTURES / "zero_infinity_nvme.json").read_text().replace("NVME_PATH", str(tmp_path)))
    cfg, warned, lines = _read(tmp_path, ds)
    assert (cfg.parallel.strategy, cfg.optim.precision, cfg.zero.offload_optimizer, cfg.zero.offload_params, cfg.zero.nvme_path) == \
        ("zero3", "bf16", "nvme", "nvme", str(tmp_path))
    assert (cfg.zero.offload_buffers, cfg.zero.offload_pin_memory) == (4, True)      # the optimizer section's count
    assert any("offload_param.buffer_count 5 is not used" in line for line in lines)
    assert {"aio", "zero_optimization.offload_param.max_in_cpu", "zero_optimization.offload_optimizer.fast_init"} \
        <= set(warned)
    ds["zero_optimization"]["offload_param"]["nvme_path"] = str(tmp_path / "other")
    _refused(tmp_path, ds, "offload_param.nvme_path", "one folder")


def test_hf_trainer_auto_takes_the_command_line(tmp_path):
    cfg, warned, lines = _read(tmp_path, "hf_trainer_bf16_zero3_auto.json")
    assert (cfg.optim.precision, cfg.training.micro_batch, cfg.optim.lr, cfg.optim.warmup) == ("fp32", 8, TrainConfig().optim.lr, TrainConfig().optim.warmup)
    note = next(line for line in lines if line.startswith("note:"))
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "bf16.enabled", "optimizer.params.lr",
                "scheduler.params.warmup_num_steps", "zero_optimization.reduce_bucket_size"):
        assert key in note
    assert any("fp16.loss_scale, " in line and "without loss scaling" in line for line in lines)
    cfg, _, lines = _read(tmp_path, "hf_trainer_bf16_zero3_auto.json", precision="fp16", micro_batch=2, lr=1e-3,
                          warmup=5)
    assert (cfg.optim.precision, cfg.training.micro_batch, cfg.optim.lr, cfg.optim.warmup) == ("fp16", 2, 1e-3, 5)
    assert cfg.optim.loss_scaler == DEEPSPEED and not any("without loss scaling" in line for line in lines)


# -- unknown, refused and warned keys ---------------------------------------------------------------

@pytest.mark.parametrize("ds, message", [
    ({"zero_optimisation": {}}, "unknown DeepSpeed config key 'zero_optimisation'; did you mean zero_optimization?"),
    ({"zero_optimization": {"overlap_com": True}},
     "unknown zero_optimization key 'overlap_com'; did you mean overlap_comm?"),
    ({"fp16": {"initial_scale_pow": 8}}, "unknown fp16 key 'initial_scale_pow'; did you mean initial_scale_power?"),
    ({"zero_optimization": {"offload_optimizer": {"pin_memroy": True}}},
     "unknown zero_optimization.offload_optimizer key 'pin_memroy'; did you mean pin_memory?"),
    ({"optimizer": {"params": {"weight_decays": 0.1}}}, "did you mean weight_decay?"),
    ({"bf16": {"enabeld": True}}, "unknown bf16 key 'enabeld'; did you mean enabled?"),
    ({"xyzzy": 1}, "unknown DeepSpeed config key 'xyzzy'; known: the keys listed in docs/deepspeed.md"),
    ({"tensor_parallel": {"qqq": 2}}, "unknown tensor_parallel key 'qqq'; known: autotp_size"),
    ({"scheduler": {"type": "WarmupCosine"}}, "did you mean WarmupCosineLR?"),
    ({"optimizer": {"type": "Lamb"}}, "optimizer.type='Lamb'; allowed: Adam, AdamW"),
    ({"optimizer": {"type": "Adam", "params": {"adam_w_mode": False, "weight_decay": 0.1}}}, "L2 regularisation"),
    ({"optimizer": {"params": {"max_grad_norm": 1.0}}}, "clip with gradient_clipping"),
    ({"sparse_attention": {"mode": "fixed"}}, "dense causal attention"),
    ({"zero_optimization": {"mics_shard_size": 4}}, "no MiCS"),
    ({"bf16": {"enabled": True}, "bfloat16": {"enabled": True}}, "give one"),
])
def test_unknown_and_unsupported_keys_are_one_line(tmp_path, ds, message):
    _refused(tmp_path, ds, message)


@pytest.mark.parametrize("key", sorted(keys.TUNING))
def test_every_tuning_key_is_one_warning_line(tmp_path, key):
    value = {"enabled": True} if "." not in key else True
    cfg, warned, lines = _read(tmp_path, _nested(key, value))
    assert warned == [key] and len(lines) == 1, lines
    assert keys.TUNING[key] in lines[0]
    if key in keys.QUIET_WHEN_OFF:                   # off it asks DeepSpeed for nothing: no line
        assert _read(tmp_path, _nested(key, {"enabled": False} if "." not in key else False))[2] == []


@pytest.mark.parametrize("key", sorted(keys.REFUSED))
def test_every_refused_key_is_refused_when_on_and_quiet_when_off(tmp_path, key):
    _refused(tmp_path, _nested(key, {"enabled": True} if "." not in key else True), key, keys.REFUSED[key])
    off = keys.OFF_VALUES.get(key, {"enabled": False} if "." not in key else False)
    assert _read(tmp_path, _nested(key, off))[2] == []


def test_docs_table_names_every_key():
    text = DOCS.read_text()
    for key in (*keys.TUNING, *keys.REFUSED):
        assert f"`{key}`" in text, key
    for section, names in keys.MAPPED.items():
        for name in names:
            assert re.search(rf"`[\w.]*\b{re.escape(name)}\b[\w.*]*`", text), (section, name)


# -- the batch ------------------------------------------------------------------------------------

@pytest.mark.parametrize("ds, overrides, micro, accum", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, {}, 4, 4),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 4}, {}, 4, 4),
    ({"train_batch_size": 32}, {}, 16, 1),                      # DeepSpeed: no accumulation then
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, {}, 4, 2),
    ({"train_batch_size": 32}, {"micro_batch": 8}, 8, 2),        # the flag's micro-batch, the file's batch
])
def test_train_batch_size_derives_the_missing_one(tmp_path, ds, overrides, micro, accum):
    cfg = _read(tmp_path, ds, **overrides)[0]
    assert (cfg.training.micro_batch, cfg.training.grad_accum, cfg.global_batch(2)) == (micro, accum, ds["train_batch_size"])


@pytest.mark.parametrize("ds, overrides, message", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, {},
     "train_batch_size=32 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x 2 data-parallel "
     "ranks = 16"),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, {"grad_accum": 2},
     "train_batch_size=32 != train_micro_batch_size_per_gpu 4 x --grad-accum 2 x 2 data-parallel ranks = 16"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, {},
     "train_batch_size=30 is not a multiple of train_micro_batch_size_per_gpu 4 x 2 data-parallel ranks = 8"),
    ({"train_batch_size": 0}, {}, "train_batch_size must be >= 1, got 0"),
])
def test_a_batch_that_does_not_add_up_is_one_line(tmp_path, ds, overrides, message):
    _refused(tmp_path, ds, message, **overrides)


# -- buckets, schedulers, flags -------------------------------------------------------------------

def test_bucket_sizes_are_elements_of_the_training_precision(tmp_path):
    n = 1 << 20
    assert _read(tmp_path, {"zero_optimization": {"stage": 2, "reduce_bucket_size": n}})[0].parallel.bucket_mb == 4.0
    ds = {"zero_optimization": {"stage": 1, "allgather_bucket_size": n}, "bf16": {"enabled": True}}
    assert _read(tmp_path, ds)[0].parallel.bucket_mb == 2.0              # ZeRO-1 gathers in its buckets
    cfg, warned, _ = _read(tmp_path, {"zero_optimization": {"stage": 0, "allgather_bucket_size": n}})
    assert cfg.parallel.bucket_mb == TrainConfig().parallel.bucket_mb and warned == ["zero_optimization.allgather_bucket_size"]
    assert _read(tmp_path, {"zero_optimization": {"reduce_bucket_size": n}}, bucket_mb=3.0)[0].parallel.bucket_mb == 3.0
    _refused(tmp_path, {"zero_optimization": {"reduce_bucket_size": 0}}, "zero_optimization.reduce_bucket_size in",
             "bucket_mb must be > 0")


def test_schedulers(tmp_path):
    cosine = {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 7, "warmup_type": "linear",
                                                   "cos_min_ratio": 0.1, "total_num_steps": 40}}
    cfg, warned, lines = _read(tmp_path, {"scheduler": cosine, "optimizer": {"params": {"lr": 2e-3}}}, steps=40)
    assert (cfg.optim.warmup, cfg.optim.lr, lines) == (7, 2e-3, [])       # ringzero's own schedule: nothing to say
    cfg, warned, lines = _read(tmp_path, {"scheduler": cosine}, steps=60)
    assert warned == ["scheduler"] and "at step 40" in lines[0]
    decay = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-5, "warmup_num_steps": 4, "total_num_steps": 90,
                                                 "last_batch_iteration": 10}}
    cfg, warned, lines = _read(tmp_path, {"scheduler": decay})
    assert (cfg.optim.warmup, cfg.optim.lr, warned) == (4, 1e-3, ["scheduler"])     # DeepSpeed's warmup_max_lr default
    for words in ("logarithmically", "starts from 0, not from 1e-05", "linearly to 0 at step 90",
                  "last_batch_iteration 10"):
        assert words in lines[0], (words, lines[0])
    cfg, warned, _ = _read(tmp_path, {"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 1}}})
    assert warned == ["scheduler"] and cfg.optim.warmup == TrainConfig().optim.warmup
    _refused(tmp_path, {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3}}},
             "total_num_steps is required by WarmupDecayLR")
    _refused(tmp_path, {"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}},
             "scheduler.params.cos_min_ratio is not a parameter of WarmupLR")
    _refused(tmp_path, {"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}},
             "warmup_type='cosine'; allowed: log, linear")


def _lrs_of_a_run(group, cfg: TrainConfig) -> list[float]:
    """The lr of each optimizer step of `cfg`'s run, taken where the engine hands it to the optimizer."""
    from ringzero.parallel.optimizer import ShardedAdam
    from ringzero.train.rank import train_rank
    seen, step = [], ShardedAdam.step

    def recorded(self, grads, divisor, loss_scale=1.0, lr=None):
        seen.append(lr)
        return step(self, grads, divisor, loss_scale, lr)

    ShardedAdam.step = recorded
    try:
        train_rank(cfg, group=group, calibrate=False)
    finally:
        ShardedAdam.step = step
    return seen


@pytest.mark.timeout(120)
def test_without_a_scheduler_the_run_steps_with_the_optimizers_lr(pool, tmp_path):
    # DeepSpeed without a scheduler: the optimizer's lr from step 1, constant (no warm-up, no decay).
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    args = cli.build_parser("train").parse_args(["train", "--config", str(path), "--steps", "3", "--model", "nano",
                                                 "--seq", "16", "--max-bytes", "32768", "--eval-every", "1000",
                                                 "--eval-batches", "1"])
    cfg = train_cmd.config_from(args, world=1)
    assert pool.run(_lrs_of_a_run, cfg, world=1)[0] == [1e-3] * 3
    cfg, _, _ = _read(tmp_path, {"optimizer": {"params": {"lr": 1e-3}}}, steps=4, warmup=2)    # a flag wins
    assert [cfg.lr_at(s) for s in range(4)] == [5e-4, 1e-3, 1e-3, 1e-3]
    warmup_lr = {"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_type": "linear", "warmup_max_lr": 2e-3}}
    cfg, _, lines = _read(tmp_path, {"scheduler": warmup_lr}, steps=6)
    assert ([cfg.lr_at(s) for s in range(6)], lines) == ([1e-3] + [2e-3] * 5, [])   # warm-up, then the peak held


def test_command_line_flags_win_over_mapped_keys(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text((FIXTURES / "megatron_gpt2_zero2.json").read_text())
    args = cli.build_parser("train").parse_args(["train", "--config", str(path), "--bucket-mb", "2", "--lr", "0.01",
                                                 "--micro-batch", "2", "--grad-accum", "2"])
    cfg = train_cmd.config_from(args, world=2)                # 8 = 2 x 2 x 2 ranks
    assert (cfg.parallel.bucket_mb, cfg.optim.lr, cfg.training.micro_batch, cfg.training.grad_accum) == (2.0, 0.01, 2, 2)


# -- communication_data_type: the gradients' cast for their reduction ---------------------------

@pytest.mark.parametrize("ds, overrides, compress, start", [
    ({"communication_data_type": "fp16"}, {}, "fp16", 0),          # fp32 training: cast from the first step
    ({"communication_data_type": "BF16"}, {}, "bf16", 0),          # DeepSpeed lowercases it
    ({"communication_data_type": "fp32"}, {}, "none", None),       # what fp32 training sends anyway
    ({"communication_data_type": None}, {}, "none", None),         # DeepSpeed's default: the training precision
    ({"bf16": {"enabled": True}, "communication_data_type": "bf16"}, {}, "none", None),
    ({"bf16": {"enabled": True}, "communication_data_type": "fp16"}, {}, "fp16", 0),
    ({"communication_data_type": "fp16"}, {"precision": "fp16"}, "none", None),     # the flag's precision
    ({"communication_data_type": "fp16"}, {"compress": "powersgd"}, "powersgd", None),  # the flag wins
    ({"communication_data_type": "fp16"}, {"compress_start": 3}, "fp16", 3),
])
def test_communication_data_type_maps_to_the_16_bit_cast(tmp_path, ds, overrides, compress, start):
    cfg, warned, lines = _read(tmp_path, ds, **overrides)
    assert (cfg.compress.compress, cfg.compress.compress_start, lines) == (compress, start, [])
    assert "communication_data_type" in keys.MAPPED[""] and "communication_data_type" not in keys.TUNING


def test_communication_data_type_fp32_under_16_bits_and_bad_values(tmp_path):
    cfg, warned, lines = _read(tmp_path, {"bf16": {"enabled": True}, "communication_data_type": "fp32"})
    assert cfg.compress.compress == "none" and warned == ["communication_data_type"] and "(bf16)" in lines[0]
    _refused(tmp_path, {"communication_data_type": "int8"}, "communication_data_type='int8'; allowed: fp16, bf16, fp32")
    _refused(tmp_path, {"communication_data_type": 16}, "communication_data_type=16; allowed")
    # a config that loaded before the key was mapped still loads: under ZeRO-3 it only says so
    cfg, _, lines = _read(tmp_path, {"zero_optimization": {"stage": 3}, "communication_data_type": "fp16"})
    assert cfg.compress.compress == "none" and cfg.parallel.strategy == "zero3"
    assert any("communication_data_type fp16 has no effect here" in line and "zero3" in line for line in lines), lines


# -- the fp16 loss scaler from the fp16 section ------------------------------------------------

def test_fp16_section_sets_the_scaler(tmp_path):
    cfg = _read(tmp_path, {"fp16": {"enabled": True, "loss_scale": 1024, "min_loss_scale": 0.5}})[0]
    assert (cfg.optim.loss_scaler.dynamic, cfg.optim.loss_scaler.initial_scale, cfg.optim.loss_scaler.min_scale) == (False, 1024.0, 0.5)
    cfg = _read(tmp_path, {"fp16": {"enabled": True, "initial_scale_power": 32, "consecutive_hysteresis": True}})[0]
    assert cfg.optim.loss_scaler == LossScalerConfig(initial_scale_power=32, window=1000, hysteresis=2,
                                               consecutive_hysteresis=True)


@pytest.mark.parametrize("fp16, message", [
    ({"loss_scale_window": 0}, "fp16.loss_scale_window: loss_scaler.window must be an integer >= 1, got 0"),
    ({"hysteresis": 0}, "fp16.hysteresis: loss_scaler.hysteresis must be an integer >= 1, got 0"),
    ({"hysteresis": 2.5}, "fp16.hysteresis must be an integer, got 2.5"),
    ({"initial_scale_power": 65},
     "fp16.initial_scale_power: loss_scaler.initial_scale_power must be an integer from 0 to 64, got 65"),
    ({"min_loss_scale": 0}, "fp16.min_loss_scale: loss_scaler.min_scale must be > 0, got 0.0"),
    ({"min_loss_scale": 1e6}, "fp16.min_loss_scale: loss_scaler.min_scale 1e+06 is above the initial scale 2**16"),
    ({"loss_scale": -1}, "fp16.loss_scale: loss_scaler.loss_scale must be >= 0 (0: dynamic scaling), got -1.0"),
    ({"consecutive_hysteresis": "yes"}, "fp16.consecutive_hysteresis must be true or false, got 'yes'"),
])
def test_bad_scaler_values_are_one_line(tmp_path, fp16, message):
    _refused(tmp_path, {"fp16": {"enabled": True, **fp16}}, message)


def test_train_config_checks_its_scaler():
    with pytest.raises(FieldError, match="loss_scaler must be a LossScalerConfig") as err:
        TrainConfig(loss_scaler={"window": 2})
    assert err.value.field == "loss_scaler"


# -- one real run ---------------------------------------------------------------------------------

def _reference_scales(skipped: list[int], start: float, window: int, hysteresis: int) -> list[float]:
    """DeepSpeed's DynamicLossScaler.update_scale, step by step, from the steps' skipped counts."""
    scale, good, left, out, before = start, 0, hysteresis, [], 0
    for total in skipped:
        overflow, before = total > before, total
        if overflow:
            scale, left, good = (max(1.0, scale / 2), left, 0) if left <= 1 else (scale, left - 1, 0)
        else:
            good += 1
            if good == window:
                scale, good, left = scale * 2, 0, hysteresis
        out.append(scale)
    return out


@pytest.mark.timeout(300)
def test_fixture_trains_end_to_end_with_the_mapped_values(capfd, tmp_path):
    report = tmp_path / "r.json"
    code = cli.main(["train", "--nproc", "2", "--config", str(FIXTURES / "quick_zero2_fp16.json"), "--steps", "3",
                     "--seq", "32", "--max-bytes", "65536", "--eval-every", "3", "--json-report", str(report)])
    out = capfd.readouterr()
    assert code == 0, out.err
    c = json.loads(report.read_text())["config"]
    assert (c["strategy"], c["precision"], c["micro_batch"], c["grad_accum"], c["log_every"]) == \
        ("zero2", "fp16", 2, 1, 1)
    assert c["bucket_mb"] == 65536 * 2 / MiB
    assert c["loss_scaler"] == {"loss_scale": 0.0, "initial_scale_power": 8, "window": 2, "hysteresis": 2,
                                "consecutive_hysteresis": False, "min_scale": 1.0}
    # Rank 0's log line after every step (steps_per_print 1) shows the scale the ranks trained with.
    steps = re.findall(r"step (\d)/3 .*loss scale (\S+)\s+skipped (\d+)", out.out)
    assert [int(s) for s, _, _ in steps] == [1, 2, 3], out.out
    scales, skipped = [float(v) for _, v, _ in steps], [int(k) for _, _, k in steps]
    assert scales == _reference_scales(skipped, 2.0**8, window=2, hysteresis=2)
    # The warnings came once each, on stderr, before any rank started.
    err = out.err.splitlines()
    start = next(i for i, line in enumerate(err) if "starting 2 local ranks" in line)
    for key in ("zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients"):
        at = [i for i, line in enumerate(err) if f"{key} has no effect here" in line]
        assert len(at) == 1 and at[0] < start, (key, out.err)
