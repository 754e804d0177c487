"""`ringzero train` from the command line: bad input is one line on stderr, exit
code 2 and nothing written, before any rank starts; a DeepSpeed config maps to the right
`TrainConfig`; one real run on 2 ranks writes a JSON report whose memory and traffic twins match.
"""

from __future__ import annotations

import json

import pytest

from ringzero import cli

from cli_errors import train_fails as _fails
from ringzero.commands import train as train_cmd
from ringzero.run.config import TrainConfig
from ringzero.run.deepspeed.reader import from_deepspeed
from ringzero.train.model import GPT

QUICK = ["--steps", "2", "--seq", "16", "--micro-batch", "1", "--max-bytes", "65536"]


def _ds(tmp_path, content) -> str:
    path = tmp_path / "ds.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


@pytest.mark.timeout(30)
def test_unknown_strategy(capsys, tmp_path):
    _fails(capsys, tmp_path, ["--nproc", "2", "--strategy", "zero4", *QUICK], "zero4", "zero3")


@pytest.mark.timeout(30)
def test_single_on_two_ranks(capsys, tmp_path):
    _fails(capsys, tmp_path, ["--nproc", "2", "--strategy", "single", *QUICK], "single", "2")


@pytest.mark.timeout(30)
def test_missing_data_path(capsys, tmp_path):
    missing = str(tmp_path / "no-such-corpus.txt")
    _fails(capsys, tmp_path, ["--nproc", "2", "--data", missing, *QUICK], missing, "does not exist")


@pytest.mark.timeout(30)
def test_unsupported_deepspeed_key(capsys, tmp_path):
    cfg = _ds(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimisation": {"stage": 2}})
    _fails(capsys, tmp_path, ["--nproc", "2", "--config", cfg, *QUICK], "'zero_optimisation'",
           "did you mean zero_optimization?")


@pytest.mark.timeout(30)
def test_unsupported_zero_optimization_key(capsys, tmp_path):
    cfg = _ds(tmp_path, {"zero_optimization": {"stage": 2, "contiguous_gradient": True}})
    _fails(capsys, tmp_path, ["--nproc", "2", "--config", cfg, *QUICK], "'contiguous_gradient'",
           "did you mean contiguous_gradients?")


@pytest.mark.timeout(30)
def test_invalid_json(capsys, tmp_path):
    cfg = _ds(tmp_path, '{"train_micro_batch_size_per_gpu": 1,')
    _fails(capsys, tmp_path, ["--nproc", "2", "--config", cfg, *QUICK], "not valid JSON")


@pytest.mark.timeout(30)
def test_missing_config_file(capsys, tmp_path):
    _fails(capsys, tmp_path, ["--nproc", "2", "--config", str(tmp_path / "ds.json"), *QUICK], "does not exist")


@pytest.mark.timeout(30)
def test_train_batch_size_that_does_not_add_up(capsys, tmp_path):
    cfg = _ds(tmp_path, {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                         "train_batch_size": 16})
    _fails(capsys, tmp_path, ["--nproc", "2", "--config", cfg, "--steps", "2", "--seq", "16"], "train_batch_size=16")


# -- DeepSpeed config ------------------------------------------------------------------------------

def test_deepspeed_config_maps_to_train_config(tmp_path):
    path = _ds(tmp_path, {
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
        "fp16": {"enabled": False}, "steps_per_print": 10,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "eps": 1e-6,
                                                  "weight_decay": 0.01}}})
    cfg = from_deepspeed(path, world=2)
    assert cfg == TrainConfig(micro_batch=4, grad_accum=2, clip=0.5, strategy="zero2", precision="bf16",
                              lr=1e-3, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01, log_every=10,
                              warmup=0, lr_schedule="constant")      # no scheduler: the optimizer's lr from step 1
    assert cfg.global_batch(2) == 16


@pytest.mark.parametrize("stage,strategy", [(0, "dp"), (1, "zero1"), (2, "zero2"), (3, "zero3")])
def test_deepspeed_zero_stage(tmp_path, stage, strategy):
    cfg = from_deepspeed(_ds(tmp_path, {"zero_optimization": {"stage": stage}, "fp16": {"enabled": True},
                                        "gradient_clipping": 0.0}), world=4)
    assert (cfg.parallel.strategy, cfg.optim.precision, cfg.optim.clip) == (strategy, "fp16", None)


def test_command_line_flags_win_over_the_config(tmp_path):
    path = _ds(tmp_path, {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}})
    args = cli.build_parser("train").parse_args(["train", "--config", path, "--strategy", "zero1", "--steps", "7"])
    cfg = train_cmd.config_from(args, world=2)
    assert (cfg.training.micro_batch, cfg.parallel.strategy, cfg.training.steps) == (4, "zero1", 7)


# -- one real run ----------------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_train_zero2_on_two_ranks_writes_matching_twins(capsys, tmp_path):
    report = tmp_path / "r.json"
    code = cli.main(["train", "--nproc", "2", "--strategy", "zero2", "--steps", "3", "--seq", "32",
                     "--micro-batch", "2", "--max-bytes", "65536", "--eval-every", "3",
                     "--json-report", str(report), "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "validation loss" in out.out
    d = json.loads(report.read_text())
    assert d["schema"] == "ringzero.train-report/2" and d["world"] == 2
    assert len(d["losses"]) == 3 and [v["step"] for v in d["val"]] == [3]
    assert d["config"]["strategy"] == "zero2"
    twins = d["twins"]
    for name, t in twins.items():
        assert set(t) == {"predicted", "measured", "unit", "error"}, name
    # Memory: ZeRO's formula up to the padding of each bucket to a multiple of the ranks, i.e. fewer
    # than world elements per bucket, and a bucket holds at least one parameter tensor.
    tensors = len(list(GPT(TrainConfig(seq=32).shape).parameters()))
    for name, per_element in (("parameters held", 4), ("gradients held", 4), ("optimizer states held", 8)):
        t = twins[name]
        assert 0 <= t["measured"] - t["predicted"] < tensors * 2 * per_element, (name, t)
    for name in ("bytes sent per step", "bytes received per step"):
        assert twins[name]["error"] == 0, (name, twins[name])
    assert abs(twins["activations saved (one micro-batch)"]["error"]) < 0.1
