"""ZeRO-Offload and ZeRO-Infinity in training: the loss trajectory with the optimizer offloaded to host
memory or NVMe equals the run without offload bit for bit (fp32, 20 steps), the swap files are gone
after the run, and bad offload input is one line before any rank starts."""

from __future__ import annotations

import json
import shutil

import pytest

from ringzero.run.config import TrainConfig
from ringzero.run.deepspeed.reader import from_deepspeed
from ringzero.train.rank import train_rank

from cli_errors import train_fails

BASE = dict(model="nano", seq=32, micro_batch=2, steps=20, max_bytes=65536, eval_every=1000, eval_batches=1)


def _losses(group, cfg):
    r = train_rank(cfg, group=group, calibrate=False, keep_params=True)
    return r.losses, r.params, r.offload


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["zero2", "zero3"])     # zero1 updates as zero2 does
def test_offloaded_optimizer_trains_bit_for_bit(pool, tmp_path, strategy):
    plain = pool.run(_losses, TrainConfig(**BASE, strategy=strategy), world=2, timeout=120)
    for device in ("cpu", "nvme"):
        path = str(tmp_path) if device == "nvme" else None
        got = pool.run(_losses, TrainConfig(**BASE, strategy=strategy, offload_optimizer=device, nvme_path=path),
                       world=2, timeout=120)
        for (losses, params, offload), (want, want_params, _) in zip(got, plain):
            assert losses == want, (device, losses, want)
            assert params == want_params
            assert offload["optimizer"]["device"] == 0
            assert (offload["disk_io"]["optimizer"]["read"] > 0) == (device == "nvme")
        assert list(tmp_path.iterdir()) == []           # the swap files are removed


@pytest.mark.parametrize("argv, words", [
    (["--nproc", "2", "--strategy", "zero2", "--offload-params", "cpu"], ("offload_params", "zero3")),
    (["--nproc", "2", "--strategy", "dp", "--offload-optimizer", "cpu"], ("offload_optimizer", "ZeRO")),
    (["--nproc", "2", "--strategy", "zero2", "--offload-optimizer", "nvme"], ("nvme_path",)),
    (["--nproc", "2", "--strategy", "zero2", "--offload-optimizer", "cpu", "--nvme-path", "/tmp"], ("nvme_path",)),
    (["--nproc", "2", "--strategy", "zero2", "--offload-optimizer", "nvme", "--nvme-path", "/no/such/dir"],
     ("/no/such/dir", "does not exist")),
    (["--nproc", "2", "--strategy", "zero2", "--offload-optimizer", "nvme", "--nvme-path", "/proc"],
     ("/proc", "not writable")),
    (["--nproc", "2", "--strategy", "zero3", "--offload-params", "nvme", "--nvme-path", "/tmp",
      "--offload-buffers", "1"], ("offload_buffers", ">= 2")),
    (["--nproc", "2", "--strategy", "zero2", "--prefetch", "2"], ("prefetch", "zero3")),
    (["--nproc", "2", "--strategy", "zero3", "--prefetch", "-1"], ("prefetch", ">= 0")),
])
def test_bad_offload_input_is_one_line(capsys, tmp_path, argv, words):
    train_fails(capsys, tmp_path, argv, *words)


def test_nvme_path_too_small_is_one_line(capsys, tmp_path, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20))
    train_fails(capsys, tmp_path, ["--nproc", "2", "--strategy", "zero2", "--offload-optimizer", "nvme",
                                   "--nvme-path", str(tmp_path)], "GiB free", "swap files need")


def test_deepspeed_offload_keys(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path), "buffer_count": 6,
                                          "pin_memory": False},
        "offload_param": {"device": "cpu"}}}))
    cfg = from_deepspeed(str(path), 2)
    assert (cfg.zero.offload_optimizer, cfg.zero.offload_params, cfg.zero.nvme_path, cfg.zero.offload_buffers, cfg.zero.offload_pin_memory) \
        == ("nvme", "cpu", str(tmp_path), 6, False)
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}))
    with pytest.raises(ValueError, match="offload_param.device"):
        from_deepspeed(str(path), 2)
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}}))
    with pytest.raises(ValueError, match="allowed: none, cpu, nvme"):
        from_deepspeed(str(path), 2)
