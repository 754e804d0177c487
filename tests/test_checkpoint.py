"""Checkpoints: a run resumed from step k equals the run never stopped, bit for bit, in every
layout; a checkpoint loads into any other layout and world size with every tensor equal; the
directory is complete or absent, never half-written."""

from __future__ import annotations

import os

import pytest
import torch

from ringzero.checkpoint.folders import resolve
from ringzero.checkpoint.load import Reader
from ringzero.checkpoint.manifest import CheckpointError, read
from ringzero.train import checkpointing
from ringzero.run.config import TrainConfig
from ringzero.train.engine import Trainer
from ringzero.train.rank import train_rank

BASE = dict(model="nano", seq=16, eval_every=1000, eval_batches=1, max_bytes=1 << 15, steps=6, warmup=2)


def _train(group, cfg):
    return train_rank(cfg, group=group, keep_params=True, calibrate=False)


LAYOUTS = {
    "dp": dict(strategy="dp"),
    "zero1": dict(strategy="zero1"),
    "zero2-bf16": dict(strategy="zero2", precision="bf16"),
    "zero3": dict(strategy="zero3"),
    "tp2": dict(strategy="dp", tp=2),
    "pp2": dict(strategy="dp", pp=2, grad_accum=2),
    "zero2-cpu-offload": dict(strategy="zero2", offload_optimizer="cpu"),
    "zero1-async-save": dict(strategy="zero1", async_save=True),
    "zero3-params-on-cpu": dict(strategy="zero3", offload_params="cpu"),
    "zero3-all-on-nvme": dict(strategy="zero3", offload_params="nvme", offload_optimizer="nvme"),
    "zero3-zero++": dict(strategy="zero3", zeropp=("qwz", "hpz", "qgz"), hpz_partition=1),
    "zero2-fp16": dict(strategy="zero2", precision="fp16"),
    "tp2-sequence-parallel": dict(strategy="dp", tp=2, sequence_parallel=True),
    "pp2-interleaved": dict(strategy="dp", pp=2, grad_accum=2, schedule="interleaved", virtual_stages=2),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_resumed_run_equals_the_run_never_stopped(pool, tmp_path, name):
    opts = dict(BASE, micro_batch=2, **LAYOUTS[name])
    if "nvme" in name:
        (tmp_path / "swap").mkdir()
        opts["nvme_path"] = str(tmp_path / "swap")
    whole = pool.run(_train, TrainConfig(save_dir=str(tmp_path), save_every=3, **opts), world=2)
    assert sorted(n for n in os.listdir(tmp_path) if n != "swap") == ["latest", "step-00000003", "step-00000006"]
    assert whole[0].checkpoint["saves"] == 2 and len(whole[1].checkpoint["write_s"]) == 2
    opts.pop("async_save", None)
    resumed = pool.run(_train, TrainConfig(resume=str(tmp_path / "step-00000003"), **opts), world=2)
    for a, b in zip(whole, resumed):
        assert b.losses == a.losses[3:]                         # bit for bit
        assert b.params.keys() == a.params.keys()
        for k in a.params:
            assert b.params[k] == a.params[k], k


def _reload(group, cfg, out):
    """Build `cfg`'s trainer (loading cfg.checkpoint.resume in this layout) and save it again, unchanged."""
    import torch.distributed as dist
    from ringzero.parallel.topology import Topology
    world = dist.get_world_size(group)
    p = cfg.placement(world)
    topo = Topology.data_parallel(group) if p.tp == 1 and p.pp == 1 else Topology.build(p, group)
    t = Trainer(cfg, topo)
    t.cfg = TrainConfig(**{**vars(cfg), "save_dir": out, "resume": None})
    path = checkpointing.save_checkpoint(t, t.start)
    t.close()
    return path


def _tensors(path):
    r = Reader(path)
    return {name: r.tensor(name) for name in r.manifest.tensors}


@pytest.mark.timeout(300)
def test_a_checkpoint_loads_into_any_layout_with_every_tensor_equal(pool, tmp_path):
    """zero3 on 4 ranks -> zero2 on 2 -> dp on 3 -> tp 2 x dp 2 -> pp 2 x dp 1 (bf16 then fp32):
    after each load the weights and Adam's states, assembled, equal the first checkpoint's."""
    first = dict(BASE, strategy="zero3", micro_batch=3, precision="bf16")
    pool.run(_train, TrainConfig(save_dir=str(tmp_path / "a"), save_every=2, **first), world=4)
    src = str(tmp_path / "a" / "step-00000002")
    want = _tensors(src)
    chain = [(dict(strategy="zero2", micro_batch=6, precision="bf16"), 2),
             (dict(strategy="dp", micro_batch=4, precision="bf16"), 3),
             (dict(strategy="zero1", tp=2, micro_batch=6, precision="bf16"), 4),
             (dict(strategy="dp", pp=2, micro_batch=3, grad_accum=4, precision="fp32"), 2)]
    for i, (layout, world) in enumerate(chain):
        out = str(tmp_path / f"b{i}")
        cfg = TrainConfig(resume=src, **dict(BASE, **layout))
        (path, *_) = pool.run(_reload, cfg, out, world=world)
        got = _tensors(path)
        if layout["precision"] == "fp32":        # the bf16 weights become their fp32 masters
            want = {k.replace("master/", "param/"): v for k, v in want.items() if not k.startswith("param/")}
        assert got.keys() == want.keys(), (layout, sorted(set(got) ^ set(want)))
        for k in want:
            assert torch.equal(got[k], want[k]), (layout, k)
        src = path


@pytest.mark.timeout(300)
def test_resharded_training_continues_as_the_original(pool, tmp_path):
    """zero3 on 4 ranks saved at step 3, resumed as zero2 on 2 and as tp 2 x dp 2: the next
    steps' losses equal the unresharded run's within 1e-6 (fp32)."""
    first = dict(BASE, strategy="zero3", micro_batch=3)
    whole = pool.run(_train, TrainConfig(save_dir=str(tmp_path), save_every=3, **first), world=4)
    for layout, world in ((dict(strategy="zero2", micro_batch=6), 2), (dict(strategy="zero1", tp=2, micro_batch=6), 4)):
        again = pool.run(_train, TrainConfig(resume=str(tmp_path / "step-00000003"), **dict(BASE, **layout)),
                         world=world)
        assert again[0].losses == pytest.approx(whole[0].losses[3:], rel=1e-6), layout


@pytest.mark.timeout(300)
def test_a_parameter_server_checkpoint_resumes_and_loads_into_data_parallelism(pool, tmp_path):
    """Sync PS, 2 workers and 2 servers, saved at step 3: resumed as it was, bit for bit; resumed as
    all-reduce DP on 2 ranks (the servers' ranges become global tensors), the same losses within
    1e-6 (sync PS is DP's arithmetic)."""
    ps = dict(BASE, strategy="ps", servers=2, micro_batch=2)
    whole = pool.run(_train, TrainConfig(save_dir=str(tmp_path), save_every=3, **ps), world=4)
    step3 = str(tmp_path / "step-00000003")
    again = pool.run(_train, TrainConfig(resume=step3, **ps), world=4)
    assert again[0].losses == whole[0].losses[3:]
    assert again[0].params == whole[0].params
    dp = pool.run(_train, TrainConfig(resume=step3, **dict(BASE, strategy="dp", micro_batch=2)), world=2)
    assert dp[0].losses == pytest.approx(whole[0].losses[3:], rel=1e-6)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_an_asynchronous_parameter_server_checkpoint_is_whole_and_resumes(pool, tmp_path, mode):
    """Async and SSP PS: with one worker (its pushes are the only ones: no staleness) a resumed run
    is the run never stopped, bit for bit; with 2 workers and 2 servers every checkpoint holds every
    tensor, every worker resumes at its step, and loaded into DP and saved again nothing changes."""
    ps = dict(BASE, strategy="ps", micro_batch=2, ps_mode=mode, staleness=1 if mode == "ssp" else 0)
    one = dict(ps, servers=1)
    whole = pool.run(_train, TrainConfig(save_dir=str(tmp_path / "one"), save_every=3, **one), world=2)
    again = pool.run(_train, TrainConfig(resume=str(tmp_path / "one" / "step-00000003"), **one), world=2)
    assert again[0].losses == whole[0].losses[3:] and again[0].params == whole[0].params
    two = dict(ps, servers=2)
    pool.run(_train, TrainConfig(save_dir=str(tmp_path / "two"), save_every=3, **two), world=4)
    step3 = str(tmp_path / "two" / "step-00000003")
    want = _tensors(step3)
    assert read(step3).layout["ps_mode"] == mode
    assert {k.split("/", 1)[0] for k in want} == {"param", "exp_avg", "exp_avg_sq"}
    resumed = pool.run(_train, TrainConfig(resume=step3, **two), world=4)
    assert len(resumed[0].losses) == 3 and all(map(torch.isfinite, torch.tensor(resumed[0].losses)))
    (path,) = pool.run(_reload, TrainConfig(resume=step3, **dict(BASE, strategy="dp", micro_batch=4)),
                       str(tmp_path / "dp"), world=1)
    got = _tensors(path)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_manifest_cannot_name_files_outside_its_directory(tmp_path):
    d = tmp_path / "step-00000001"
    d.mkdir()
    text = ('{"format": "ringzero.checkpoint/1", "step": 1, "layout": {}, "config": {}, "tensors": '
            '{"param/w": {"shape": [2], "dtype": "float32", "pieces": [{"file": "../../etc/passwd", '
            '"key": "k", "flat": [0, 2], "tp": null}]}}}')
    (d / "manifest.json").write_text(text)
    with pytest.raises(CheckpointError, match="outside its directory"):
        read(str(d))


def test_incomplete_checkpoints_are_never_loaded(tmp_path):
    (tmp_path / "step-00000004.tmp").mkdir()                 # a save that died before its rename
    (tmp_path / "step-00000002").mkdir()                     # renamed but without a manifest: never
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve(str(tmp_path))


def _snap(step: int, rank: int = 0, world: int = 1, keep=None):
    from ringzero.checkpoint.save import snapshot
    meta = {"layout": {}, "config": {}, "scaler": {}, "optimizer_step": step}
    return snapshot(step, rank, world, [], {"torch": torch.zeros(1)}, meta, "tok", keep, copy=False)


def test_a_resumed_run_retires_the_abandoned_later_checkpoints(tmp_path):
    """Saved at 2 and 4, resumed from 2, saving 3 with keep 1: 4 belonged to the abandoned run and
    goes (renamed away first, never half-deleted under its name); 3 is the newest and `latest`."""
    from ringzero.checkpoint.save import write
    for step in (2, 4):
        write(str(tmp_path), _snap(step))
    write(str(tmp_path), _snap(3, keep=1))
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-00000003"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000003"
    assert resolve(str(tmp_path)).endswith("step-00000003")


def test_a_rank_that_cannot_write_its_shard_is_reported_not_waited_for(tmp_path):
    from ringzero.checkpoint.save import marker, tmp_dir, write
    tmp = tmp_dir(str(tmp_path), 5, "tok")
    os.makedirs(tmp)
    with open(os.path.join(tmp, marker(1) + ".failed"), "w") as f:
        f.write("OSError: No space left on device")
    with pytest.raises(OSError, match="rank 1 could not write its shard: OSError: No space left"):
        write(str(tmp_path), _snap(5, rank=0, world=2), wait_s=30)
    assert not [n for n in os.listdir(tmp_path) if not n.endswith(".tmp-tok")]     # nothing published


def test_markers_are_waited_for_until_the_deadline_or_without_one(tmp_path):
    """A rank's marker missing past `wait_s` is a TimeoutError naming it; with `wait_s` None (a
    parameter server's workers, whose servers save when the slowest worker gets there) the wait
    lasts until the marker comes."""
    import threading
    from ringzero.checkpoint.save import _wait_marker, marker
    with pytest.raises(TimeoutError, match="rank 1 did not finish writing its shard within 0.05 s"):
        _wait_marker(str(tmp_path), 1, 0.05)
    late = threading.Timer(0.3, lambda: (tmp_path / marker(1)).write_text('[{"name": "x"}]'))
    late.start()
    assert _wait_marker(str(tmp_path), 1, None) == [{"name": "x"}]
    late.join()


def test_a_tensor_parallel_slice_that_cannot_be_cut_is_refused(tmp_path):
    d = tmp_path / "step-00000001"
    d.mkdir()
    tp = '{"dim": 0, "stride": 0, "index": 0, "parts": 2, "shape": [2, 2]}'
    (d / "manifest.json").write_text(
        '{"format": "ringzero.checkpoint/1", "step": 1, "layout": {}, "config": {}, "tensors": {"param/w": '
        '{"shape": [4, 2], "dtype": "float32", "pieces": [{"file": "r.safetensors", "key": "k", "flat": [0, 4], '
        f'"tp": {tp}}}]}}}}}}')
    with pytest.raises(CheckpointError, match="cannot be cut from shape"):
        read(str(d))
