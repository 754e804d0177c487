"""`TrainConfig` in sections, one per option module: built from sections or from the flat names the
command line and JSON use, each section validating its own fields."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from ringzero.commands.train import FLAGS
from ringzero.run.config import SECTIONS, TrainConfig, flat_fields
from ringzero.run.fields import FieldError
from ringzero.run.parallel_options import ParallelConfig
from ringzero.run.training_options import TrainingConfig
from ringzero.run.zero_options import ZeroConfig


def test_flat_names_build_the_sections_and_round_trip():
    cfg = TrainConfig(model="micro", strategy="zero3", steps=7, prefetch=2, lr=1e-3, save_dir="/tmp/x")
    assert (cfg.model.name, cfg.parallel.strategy, cfg.training.steps, cfg.zero.prefetch, cfg.optim.lr,
            cfg.checkpoint.save_dir) == ("micro", "zero3", 7, 2, 1e-3, "/tmp/x")
    assert TrainConfig(**cfg.flat()) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg and hash(pickle.loads(pickle.dumps(cfg))) == hash(cfg)
    assert cfg.as_dict()["loss_scaler"]["window"] == cfg.optim.loss_scaler.window


def test_sections_and_flat_names_together_the_flat_name_wins():
    cfg = TrainConfig(training=TrainingConfig(steps=3, micro_batch=2), parallel=ParallelConfig(strategy="zero1"),
                      steps=5)
    assert (cfg.training.steps, cfg.training.micro_batch, cfg.parallel.strategy) == (5, 2, "zero1")
    again = dataclasses.replace(cfg, grad_accum=4)
    assert again.training == TrainingConfig(steps=5, micro_batch=2, grad_accum=4) and again.parallel == cfg.parallel


def test_every_flat_name_is_in_one_section_and_every_flag_is_one():
    names = flat_fields()
    per_section = sum(len(dataclasses.fields(cls)) for cls in SECTIONS.values())
    assert len(names) == per_section                       # no flat name shared by two sections
    assert set(FLAGS) <= set(names)
    with pytest.raises(TypeError, match="stepz"):
        TrainConfig(stepz=3)


@pytest.mark.parametrize("build, field", [
    (lambda: ZeroConfig(prefetch=-1), "prefetch"),
    (lambda: ZeroConfig(offload_params="nvme"), "nvme_path"),
    (lambda: TrainingConfig(steps=0), "steps"),
    (lambda: ParallelConfig(strategy="zero4"), "strategy"),
    (lambda: TrainConfig(strategy="zero2", prefetch=2), "prefetch"),      # needs another section: the whole config
    (lambda: TrainConfig(model="nope"), "model"),
])
def test_a_section_refuses_its_own_bad_field_and_the_config_what_needs_two(build, field):
    with pytest.raises(FieldError) as e:
        build()
    assert e.value.field == field


@pytest.mark.parametrize("fields", [
    {},
    dict(strategy="zero2", straggler=(1, 2.0), emulate_inter_node=(0.05, 20.0), ranks_per_node=1),
    dict(strategy="zero3", zeropp=("qwz", "hpz"), hpz_partition=2, precision="bf16", betas=(0.8, 0.9)),
    dict(precision="fp16", pp=2, layers=2, grad_accum=4, pipeline_cost=(0.02, 0.04)),
])
def test_from_dict_reads_back_what_as_dict_wrote(fields):
    import json
    cfg = TrainConfig(**fields)
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.as_dict()))) == cfg
    assert TrainConfig.from_dict(cfg.as_dict(), grad_accum=8).training.grad_accum == 8
