"""Bad training settings fail before any rank starts, in one line; engine guards."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.plan.strategies.sharding import DP
from ringzero.parallel.topology import Topology
from ringzero.parallel.strategies import apply_sharding
from ringzero.run.config import TrainConfig
from ringzero.run.deepspeed.reader import from_deepspeed


@pytest.mark.parametrize("kw, message", [
    (dict(bucket_mb=0), "bucket_mb must be > 0"),
    (dict(betas=(0.9,)), "betas must be two numbers"),
    (dict(betas=(1.5, 0.9)), "betas must be two numbers"),
    (dict(eps=-1.0), "eps must be > 0"),
    (dict(seq=0), "seq must be >= 1"),
    (dict(lr=-1.0), r"^lr must be > 0, got -1\.0$"),
    (dict(lr=float("inf")), r"^lr must be > 0, got inf$"),
    (dict(warmup=-2), r"^warmup must be >= 0, got -2$"),
    (dict(weight_decay=-0.1), r"^weight_decay must be >= 0, got -0\.1$"),
    (dict(steps=2.5), r"^steps must be an integer, got 2\.5$"),
    (dict(log_every=0), r"^log_every must be >= 1, got 0$"),
    (dict(clip=0.0), r"^clip must be > 0"),
    (dict(comm_algorithm="recursive_halving"), r"^comm_algorithm 'recursive_halving' .*allowed: auto, torch"),
])
def test_train_config_rejects(kw, message):
    with pytest.raises(ValueError, match=message) as err:
        TrainConfig(**kw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("ds, message", [
    ({"zero_optimization": 2}, "zero_optimization must be a JSON object"),
    ({"fp16": True}, "fp16 must be a JSON object"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "both true"),
    ({"optimizer": {"params": {"betas": [0.9]}}}, "betas must be a list of two numbers"),
    ({"optimizer": {"params": {"betas": 0.9}}}, "betas must be a list of two numbers"),
    ({"zero_optimization": {"stage": 1.5}}, "zero_optimization.stage must be an integer"),
    ({"train_micro_batch_size_per_gpu": None}, "must be an integer"),
    ([1, 2], "must hold a JSON object"),
    ({"fp16": {"enabled": "false"}}, r"^fp16\.enabled must be true or false, got 'false'$"),
    ({"bf16": {"enabled": "yes"}}, r"^bf16\.enabled must be true or false, got 'yes'$"),
    ({"fp16": {"enabled": 1}}, r"^fp16\.enabled must be true or false, got 1$"),
    ({"optimizer": {"params": {"betas": [False, 0.9]}}}, r"betas\[0\] must be a finite number, got False"),
    ({"optimizer": {"type": ["adam"]}}, r"optimizer\.type=\['adam'\]"),
    ({"train_batch_size": True}, "train_batch_size must be an integer, got True"),
    ({"train_batch_size": "2"}, "train_batch_size must be an integer, got '2'"),
    ({"steps_per_print": "10"}, "steps_per_print must be an integer"),
    ({"steps_per_print": 0}, r"^steps_per_print in .*log_every must be >= 1, got 0$"),
    ({"gradient_clipping": -1}, r"^gradient_clipping in .*clip must be > 0"),
    ({"train_micro_batch_size_per_gpu": 0}, r"^train_micro_batch_size_per_gpu in .*micro_batch must be >= 1"),
])
def test_deepspeed_config_errors_are_one_line(tmp_path, ds, message):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    with pytest.raises(ValueError, match=message) as err:
        from_deepspeed(str(path), world=2)
    assert "\n" not in str(err.value)


def test_deepspeed_booleans_and_steps_per_print(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"fp16": {"enabled": False}, "bf16": {"enabled": True}, "steps_per_print": 7}))
    cfg = from_deepspeed(str(path), world=2)
    assert (cfg.optim.precision, cfg.training.log_every) == ("bf16", 7)
    assert TrainConfig().training.log_every is None


def test_deepspeed_nan_and_duplicate_keys_are_refused(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"optimizer": {"params": {"lr": NaN}}}')
    with pytest.raises(ValueError, match="optimizer.params.lr must be a finite number, got nan"):
        from_deepspeed(str(path), world=2)
    path.write_text('{"fp16": {"enabled": true}, "fp16": {"enabled": false}}')
    with pytest.raises(ValueError, match="'fp16' appears more than once"):
        from_deepspeed(str(path), world=2)


def test_deepspeed_config_that_is_a_folder_or_binary(tmp_path):
    binary = tmp_path / "ds.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    for path, words in ((tmp_path, "is a folder"), (binary, "is not UTF-8 text")):
        with pytest.raises(ValueError, match=words) as err:
            from_deepspeed(str(path), world=2)
        assert str(path) in str(err.value) and "\n" not in str(err.value)


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.idle = nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x).sum()


def test_a_parameter_without_gradient_is_named_whatever_the_buckets():
    for bucket_mb in (25.0, 1e-5):       # one bucket, or a bucket per tensor (all of it idle)
        model = _Unused()
        sh = apply_sharding(model, Topology(world=1, rank=0, dp=1), ShardingConfig(sharding=DP, bucket_mb=bucket_mb))
        model(torch.randn(2, 4)).backward()
        with pytest.raises(RuntimeError, match="idle.weight"):
            sh.finish_backward()
        sh.close()


def test_recommendation_falls_back_to_zero3_when_no_tp_pp_grid_fits():
    from ringzero.plan import Training, hardware, recommend
    from ringzero.plan.model.shapes import ModelShape
    m = ModelShape(layers=41, hidden=8145, heads=45, vocab=32000, seq=2048)   # 41 layers, 45 heads: no grid
    r = recommend(m, Training(), hardware("a100-80gb"), 16)
    assert r.parallel is not None and r.parallel.zero == 3 and r.parallel.dp == 16
