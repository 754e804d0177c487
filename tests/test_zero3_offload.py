"""ZeRO-3 with its weight shards in host memory or on NVMe (ZeRO-Infinity's parameter offload):
bit for bit plain ZeRO-3's losses and parameters (alone and with the optimizer offloaded too), every
byte by location and every disk byte of a step equal to `plan.strategies.offload`'s formulas, no weight left on
the device between steps, swap files removed after the run; and `twin.offload`, the
predicted side of `RankResult.offload`, equal to what runs measure."""

from __future__ import annotations

import os

import pytest
import torch

from ringzero.parallel.offload.config import OffloadConfig
from ringzero.parallel.optimizer import AdamConfig, ShardedAdam
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.plan.strategies.sharding import ZERO3
from ringzero.parallel.strategies import apply_sharding
from ringzero.parallel.topology import Topology
from ringzero.parallel.offload.shards import Staging
from ringzero.plan.strategies import offload as plan
from ringzero.plan.strategies.offload import OffloadDevice, param_record_bytes
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank
from ringzero.train.model import GPT
from ringzero.twin.offload import predict_offload

WORLD = 2
BASE = dict(model="nano", seq=32, micro_batch=2, max_bytes=65536, eval_every=1000, eval_batches=1)
PARITY = (("cpu", "none", "fp32"), ("nvme", "none", "fp32"), ("cpu", "cpu", "fp32"), ("nvme", "nvme", "fp32"),
          ("nvme", "cpu", "bf16"))
"""(offload_params, offload_optimizer, precision) of the parity runs."""
STEPS = {"fp32": 20, "bf16": 4}
"""Steps of a parity run (bf16 matmuls are slow on a CPU)."""

_RUNS: dict[TrainConfig, list] = {}


@pytest.fixture(scope="module")
def swap_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("swap"))


def _train(group, cfg: TrainConfig):
    r = train_rank(cfg, keep_params=True, group=group, calibrate=False)
    return {"losses": r.losses, "params": r.params, "offload": r.offload, "held": r.held, "buckets": r.buckets}


def _run(pool, cfg: TrainConfig) -> list[dict]:
    """Every rank's results of `cfg` on WORLD ranks (cached: the twin tests reuse the parity runs)."""
    if cfg not in _RUNS:
        _RUNS[cfg] = pool.run(_train, cfg, world=WORLD, timeout=120)
    return _RUNS[cfg]


def _config(swap_dir, params="none", optimizer="none", **kw) -> TrainConfig:
    nvme = "nvme" in (params, optimizer)
    return TrainConfig(**{**BASE, "strategy": "zero3", "steps": 20, **kw}, offload_params=params,
                       offload_optimizer=optimizer, nvme_path=swap_dir if nvme else None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("params, optimizer, precision", PARITY)
def test_runs_are_bit_for_bit_plain_zero3(pool, swap_dir, params, optimizer, precision):
    want = _run(pool, _config(swap_dir, precision=precision, steps=STEPS[precision]))
    got = _run(pool, _config(swap_dir, params, optimizer, precision=precision, steps=STEPS[precision]))
    for rank in range(WORLD):
        assert got[rank]["losses"] == want[rank]["losses"]
        assert got[rank]["params"] == want[rank]["params"]
    assert os.listdir(swap_dir) == []            # every swap file removed at the end of the run


def _shards(res: dict) -> list[tuple[int, bool]]:
    """(shard elements, is root) of each bucket: padded to a multiple of the ranks, as FlatBucket pads."""
    return [(-(-n // WORLD), root) for n, root, *_ in res["buckets"]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("params, optimizer, precision", PARITY)
def test_bytes_by_location_and_disk_bytes_per_step_are_the_planners(pool, swap_dir, params, optimizer, precision):
    cfg = _config(swap_dir, params, optimizer, precision=precision, steps=STEPS[precision])
    device, wb = OffloadDevice(params), cfg.value_bytes
    plain = _run(pool, _config(swap_dir, precision=precision, steps=STEPS[precision]))
    for res, want in zip(_run(pool, cfg), plain):
        shards = _shards(res)
        sizes = [n for n, _ in shards]
        assert res["offload"]["params"] == plan.param_placement(device, sizes, wb, cfg.zero.offload_buffers).as_dict()
        assert res["offload"]["disk_io"]["params"] == plan.param_io_per_step(device, shards, wb, cfg.training.grad_accum)
        # Between steps every shard is in the store: plain ZeRO-3's device shards are gone.
        assert res["held"]["params"] == 0 and want["held"]["params"] == sum(sizes) * wb
        assert res["held"]["grads"] == want["held"]["grads"]


def test_disk_bytes_counted_by_hand_on_two_layers_and_a_root():
    # fp32 shards of 1000 (4000 B -> one 4 KiB record) and 1025 (4100 B -> 8 KiB) elements per
    # layer, a root of 3000 (12000 B -> 12 KiB); two micro-batches: each layer read twice per
    # micro-batch, the root once, then all three before the update; all three written once.
    buckets = [(1000, False), (1025, False), (3000, True)]
    io = plan.param_io_per_step(OffloadDevice.NVME, buckets, 4, 2)
    assert io == {"read": 2 * (2 * 4096 + 2 * 8192 + 12288) + 24576, "write": 24576}
    assert plan.param_io_per_step(OffloadDevice.CPU, buckets, 4, 2) == {"read": 0, "write": 0}
    assert param_record_bytes(1025, 2) == 4096


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy, optimizer, params, accum", [
    ("zero2", "cpu", "none", 1), ("zero2", "nvme", "none", 1), ("zero3", "cpu", "none", 1),
    ("zero3", "nvme", "none", 1), ("zero3", "none", "nvme", 2), ("zero3", "nvme", "cpu", 1)])
def test_predicted_offload_is_what_runs_measure(pool, swap_dir, strategy, optimizer, params, accum):
    cfg = _config(swap_dir, params, optimizer, strategy=strategy, steps=2, grad_accum=accum)
    for res in _run(pool, cfg):
        assert predict_offload(cfg, WORLD, res["buckets"]) == res["offload"]
    assert os.listdir(swap_dir) == []


def test_predicted_offload_without_offload_is_the_optimizer_beside_the_weights():
    cfg = TrainConfig(**BASE, strategy="dp", steps=2)
    got = predict_offload(cfg, WORLD, [(1000, False)])
    assert got["optimizer"] == {"device": 8 * 1000, "host": 0, "disk": 0}     # fp32: m and v
    assert got["params"] == {"device": 0, "host": 0, "disk": 0}
    assert got["disk_io"] == {"optimizer": {"read": 0, "write": 0}, "params": {"read": 0, "write": 0}}


def test_reads_start_a_layer_ahead_and_staging_holds_weights_only_around_the_update(tmp_path):
    """One rank, shards on NVMe through the fewest buffers (2): every load of a pass but its first
    finds its read started by the gather before it, none is left pending, and the optimizer's
    shard tensors own storage only from construction to the first forward and around the update."""
    torch.manual_seed(0)
    cfg = TrainConfig(**BASE, strategy="zero3", steps=1)
    model = GPT(cfg.shape)
    offload = OffloadConfig(device="nvme", nvme_path=str(tmp_path), buffer_count=2)
    sh = apply_sharding(model, Topology.alone(), ShardingConfig(sharding=ZERO3, offload_params=offload))
    opt = ShardedAdam(sh.owned_weights(), AdamConfig(lr=1e-3))
    shard_bytes = sum(w.numel() * w.element_size() for w in sh.owned_weights())
    store = sh.shards.store
    loads, load = [], store.load
    store.load = lambda i, out=None: (loads.append((i, i in store.pending)), load(i, out))[1]
    try:
        assert sh.shards.staging is Staging.BUILT and sh.held_bytes()["params"] == shard_bytes
        x = torch.randint(0, cfg.shape.vocab, (2, cfg.shape.seq))
        model(x, x).backward()
        sh.finish_backward()
        root = len(sh.groups) - 1                  # the root bucket comes after the layers'
        assert sh.groups[root].root
        order = list(range(root))
        assert loads == [(root, False)] + [(i, True) for i in order + order[::-1]]
        assert sh.shards.staging is Staging.RELEASED and sh.held_bytes()["params"] == 0
        loads.clear()
        sh.before_step()
        assert loads == [(0, False)] + [(i, True) for i in range(1, len(sh.groups))]
        assert sh.shards.staging is Staging.LOADED and sh.held_bytes()["params"] == shard_bytes
        opt.step(sh.reduced_grads(), divisor=1.0)
        sh.after_step()
        assert sh.shards.staging is Staging.RELEASED and sh.held_bytes()["params"] == 0
        assert not store.pending and not sh.shards.loading
    finally:
        sh.close()
    assert os.listdir(tmp_path) == []
