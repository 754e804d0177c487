"""`ringzero bench train`: tiny real runs through the CLI (every suite), and argument checks."""

import json

import pytest

from ringzero import cli
from ringzero.bench import train as bench

TINY = ["--model", "nano", "--seq", "16", "--micro-batch", "1", "--steps", "2", "--skip", "1",
        "--rc-layers", "1", "--rc-hidden", "16", "--rc-heads", "2", "--rc-seq", "32", "--rc-batch", "1",
        "--rc-steps", "2"]


@pytest.mark.timeout(120)
def test_tiny_run_writes_every_ratio(tmp_path, capsys):
    out = tmp_path / "bench_train.json"
    assert cli.main(["bench", "train", "--nproc", "2", *TINY, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["ratios"]) == set(bench.TARGETS)
    assert all(r["value"] > -1 for r in result["targets"])
    for suite in ("dp", "zero3"):       # same model, data and optimizer: the losses agree
        assert result[suite]["max_loss_diff"] < 1e-3
    modes = result["recompute"]["modes"]
    assert modes["full"]["activations"] < modes["selective"]["activations"] < modes["none"]["activations"]
    assert "performance targets" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_fused_adam_peers_train_the_same_model(tmp_path):
    out = tmp_path / "bench_train.json"
    assert cli.main(["bench", "train", "--nproc", "2", *TINY, "--suites", "dp,zero3", "--torch-adam", "fused",
                     "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["settings"]["torch_optimizer"] == "torch.optim.AdamW(fused=True)"
    for suite in ("dp", "zero3"):
        assert result[suite]["max_loss_diff"] < 1e-3


@pytest.mark.parametrize("argv, message", [
    (["--suites", "dp,tp"], "--suites"),
    (["--nproc", "1", "--suites", "dp"], "--nproc"),
    (["--steps", "1"], "--steps"),
    (["--torch-adam", "sgd"], "--torch-adam"),
    (["--rc-hidden", "30", "--rc-heads", "4"], "divisible"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    assert cli.main(["bench", "train", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_tensor_parallel_against_torch_parallelize_module(tmp_path):
    """--tp 2: ringzero's Megatron split and torch's ColwiseParallel/RowwiseParallel train the same
    model (qkv reordered so torch's contiguous split is by heads): the losses agree."""
    out = tmp_path / "bench_train.json"
    assert cli.main(["bench", "train", "--nproc", "2", *TINY, "--suites", "dp", "--tp", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tp"]["max_loss_diff"] < 1e-4
    assert "tp_time_vs_torch_tp" in result["ratios"]


@pytest.mark.timeout(120)
def test_pipelines_against_torch_distributed_pipelining(tmp_path):
    """--pp 2: ringzero's GPipe, 1F1B and interleaved schedules and torch.distributed.pipelining's on
    the same chunks train the same model (losses within 1e-5 over a few steps), each ratio reported."""
    out = tmp_path / "bench_train.json"
    assert cli.main(["bench", "train", "--nproc", "2", *TINY, "--suites", "", "--pp", "2", "--pp-layers", "4",
                     "--pp-microbatches", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for s in ("gpipe", "1f1b", "interleaved"):
        losses = result[f"pp_{s}"]["variants"][f"rz_pp_{s}"]["losses"]
        assert result[f"pp_{s}"]["max_loss_diff"] <= 1e-5 * max(losses), s
        assert f"pp_{s}_time_vs_torch" in result["ratios"]


@pytest.mark.timeout(120)
def test_compression_against_ddp_with_torchs_hook(tmp_path, capsys):
    """--compress powersgd: ringzero dp with PowerSGD against DDP with torch's powerSGD_hook (both from
    step 2, same rank and seed): the ratio and both losses after the steps are reported, and the losses
    agree (ringzero's hook follows torch's P/Q layout and seeding)."""
    out = tmp_path / "bench_train.json"
    assert cli.main(["bench", "train", "--nproc", "2", *TINY, "--steps", "3", "--suites", "compress",
                     "--compress", "powersgd", "--powersgd-rank", "2", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    c = r["compress"]
    assert (c["scheme"], c["torch_hook"], c["start"], c["torch_start"]) == ("powersgd", "powerSGD_hook.powerSGD_hook", 2, 2)
    assert set(r["ratios"]) == {"compress_powersgd_time_vs_ddp_hook"} and r["ratios"]["compress_powersgd_time_vs_ddp_hook"] > 0
    ours, theirs = c["loss_after"]["rz_dp_powersgd"], c["loss_after"]["ddp_powersgd_hook"]
    assert abs(ours - theirs) < 1e-3 * ours and c["max_loss_diff"] < 1e-3
    assert "loss after 3 steps" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--suites", "compress"], "--compress"),
    (["--compress", "none"], "fp16, bf16, powersgd, topk"),
    (["--powersgd-rank", "2"], "--compress"),
    (["--compress", "fp16", "--powersgd-rank", "2"], "powersgd_rank"),
    (["--compress", "powersgd", "--steps", "2", "--skip", "1"], "compress_start"),
    (["--compress", "fp16", "--nproc", "1", "--suites", ""], "--nproc"),
    (["--nproc", "2", "--tp", "3"], "--tp 3"),
    (["--nproc", "2", "--pp", "4"], "--pp 4"),
    (["--nproc", "2", "--pp", "2", "--pp-layers", "1"], "more than the 1 layers"),
    (["--nproc", "3", "--tp", "3", "--model", "nano"], "tp=3 does not divide the heads"),
])
def test_bad_compression_and_model_parallel_arguments_exit_2(argv, message, capsys):
    assert cli.main(["bench", "train", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_zeropp_against_zero3_over_emulated_nodes(tmp_path, capsys):
    out = tmp_path / "zeropp.json"
    assert cli.main(["bench", "train", "--nproc", "2", "--model", "nano", "--seq", "16", "--micro-batch", "1",
                     "--steps", "3", "--strategy", "zero3", "--zeropp", "qwz,qgz", "--ranks-per-node", "1",
                     "--emulate-inter-node", "5", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for variant in ("zero3", "zeropp_run"):          # every cross-node byte has its twin
        assert result[variant]["cross_node_bytes"] == result[variant]["predicted_cross_node_bytes"] > 0
    assert result["ratios"]["cross_node_bytes"] <= 0.27
    assert "cross-node bytes ZeRO++ / ZeRO-3" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--zeropp", "qwz", "--strategy", "zero2"], "zero3"),
    (["--zeropp", "qwz,nope"], "qwz, hpz, qgz"),
    (["--ranks-per-node", "2"], "--zeropp"),
    (["--zeropp", "hpz", "--nproc", "4", "--ranks-per-node", "3"], "ranks_per_node"),
    (["--zeropp", "qgz", "--ranks-per-node", "1", "--emulate-inter-node", "-1"], "--emulate-inter-node"),
])
def test_bad_zeropp_arguments_exit_2(argv, message, capsys):
    assert cli.main(["bench", "train", *argv]) == 2
    assert message in capsys.readouterr().err
