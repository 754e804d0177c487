"""Each formula written once in `ringzero.plan`, and every place that used to write it again now
gives the same numbers through it:

- a sharded flat bucket's shard ⌈n/N⌉ and padded total ⌈n/N⌉·N (`sharding.shard_numel`,
  `padded_numel`): the engine's `FlatBucket`, the strategies' collectives, ZeRO++, the memory and
  step-time formulas, the traffic ops and the twin's offload shards;
- the bytes of one value per precision (`config.VALUE_BYTES`, `value_bytes`);
- the schedule's effective virtual stages (`schedule.effective_virtual_stages`);
- a bubble's seconds from its fraction (`schedule.bubble_seconds`), in the planner and the twin;
- what each ZeRO stage shards (`sharding.by_zero`), read by memory, step time and the plan table;
- the pipeline figure written as every output is (`outputs.write_with`).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from rich.console import Console

from ringzero import outputs
from ringzero.commands import plan_render
from ringzero.parallel.flat import FlatBucket
from ringzero.parallel.precision import DTYPES
from ringzero.plan import Parallel, Training, estimate, hardware, model, step_time
from ringzero.plan.config import PRECISIONS, VALUE_BYTES, value_bytes
from ringzero.plan.model import activations as act
from ringzero.plan.model.compute import optimizer_seconds
from ringzero.plan.model.shapes import param_count
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.strategies import memory, traffic, zeropp
from ringzero.plan.strategies.sharding import STRATEGIES, ZERO1, by_zero, padded_numel, shard_numel
from ringzero.plan.step_time import offload_seconds, update_seconds
from ringzero.run.config import TrainConfig
from ringzero.twin import offload as twin_offload
from ringzero.twin import pipeline as twin_pipeline
from ringzero.twin import pipeline_plot
from ringzero.twin import step as twin_step

SIZES = [(10, 4, 3), (8, 4, 2), (0, 4, 0), (1, 8, 1), (7, 1, 7), (7_000_000_001, 64, 109_375_001)]
"""(elements, ranks, ⌈elements/ranks⌉)."""
A100 = hardware("a100-80gb")


# -- the shard of a flat bucket ---------------------------------------------------------------------

@pytest.mark.parametrize("n,dp,shard", SIZES)
def test_shard_and_padded_numel(n, dp, shard):
    assert shard_numel(n, dp) == shard == math.ceil(n / dp)
    assert padded_numel(n, dp) == shard * dp
    assert padded_numel(n, dp) >= n > padded_numel(n, dp) - dp or n == 0


@pytest.mark.parametrize("n,dp", [(10, 4), (8, 4), (1, 3), (13, 1)])
def test_the_engine_bucket_pads_as_the_planner_counts(n, dp):
    params = [torch.nn.Parameter(torch.zeros(k)) for k in (n - n // 2, n // 2) if k]
    for index in range(dp):
        b = FlatBucket(params, dp, index)
        assert (b.shard, b.padded) == (shard_numel(n, dp), padded_numel(n, dp))
        assert (b.lo, b.hi) == (index * b.shard, (index + 1) * b.shard)


def test_the_strategies_and_zeropp_move_the_padded_bucket():
    counts = {c[1] for c in ZERO1.calls([(10, False)], 4, 2, 1) if c[0] != "all_reduce"}
    assert counts == {12} == {padded_numel(10, 4)}
    calls = zeropp.bucket_calls(zeropp.ZeroPP(partition=2), 10, False, 4, 2, 1)
    assert ("dp", ("reduce_scatter", 12, 2, 1, "dp")) in calls
    hpz = zeropp.ZeroPP(hpz=True, partition=2)        # 1/partition of each padded layer bucket
    assert zeropp.secondary_bytes(hpz, [(10, False), (5, True)], 4, 2) == padded_numel(10, 4) // 2 * 2 == 12


def test_memory_and_traffic_use_the_same_shard():
    sb = memory.state_bytes("bf16", "adam")
    # 10 parameters on 4 dp ranks: shards of 3 (the old ceil(10/4)), 2 + 2 + 12 bytes each
    want = {0: (20, 20, 120), 1: (20, 20, 36), 2: (20, 6, 36), 3: (6, 6, 36)}
    for zero, states in want.items():
        assert memory.model_states(10, sb, dp=4, zero=zero)[:3] == states
    ops = traffic._data_parallel_ops(10, 2, 1, 4, 1, 1, 1, 8, "ring")
    assert {op.count for op in ops} == {12}


@pytest.mark.parametrize("dp,zero", [(1, 0), (4, 0), (4, 1), (6, 3)])
def test_the_step_time_shards_are_unchanged(dp, zero):
    m, tr = model("gpt2"), Training(micro_batch=1)
    local = memory.model_parallel_params(param_count(m).total, 1, 1)
    par = Parallel(dp=dp, zero=zero)
    old = math.ceil(local / (dp if zero >= 1 else 1))
    assert update_seconds(m, tr, par, A100) == optimizer_seconds(old, tr.optimizer, A100)
    if zero:
        off = Parallel(dp=dp, zero=zero, offload="cpu")
        sb, shard = memory.state_bytes(tr.precision, tr.optimizer), math.ceil(local / dp)
        want = shard * (sb.grads + sb.weights) / A100.pcie_bw + shard / 1e9
        assert offload_seconds(m, tr, off, A100) == pytest.approx(want, rel=1e-15)


def test_the_twin_offload_shards_are_unchanged():
    cfg = TrainConfig(model="nano", strategy="zero1", offload_optimizer="cpu")
    buckets = [(1001, True), (64, False)]
    assert twin_offload.optimizer_shards(cfg, 4, buckets) == [251, 16]
    dp = TrainConfig(model="nano", strategy="dp")
    assert twin_offload.optimizer_shards(dp, 4, buckets) == [1001, 64]


# -- bytes per value ------------------------------------------------------------------------------

def test_value_bytes_per_precision():
    assert VALUE_BYTES == {"fp32": 4, "bf16": 2, "fp16": 2}
    assert set(VALUE_BYTES) == set(PRECISIONS)
    for p in PRECISIONS:
        assert value_bytes(p) == Training(precision=p).bytes_per_value == TrainConfig(precision=p).value_bytes
        assert torch.empty((), dtype=DTYPES[p]).element_size() == value_bytes(p)
        sb = memory.state_bytes(p, "adam")
        assert (sb.weights, sb.grads) == (value_bytes(p), value_bytes(p))
    assert memory.state_bytes("bf16", "adam").total == 16 and memory.state_bytes("fp32", "adam").total == 16
    assert memory.state_bytes("fp16", "sgd-momentum").total == 12
    with pytest.raises(ValueError, match="allowed: fp32, bf16, fp16"):
        value_bytes("fp8")


def test_the_traffic_itemsize_is_the_value_bytes():
    m = model("gpt2")
    for p in PRECISIONS:
        (op,) = traffic.data_parallel_ops(m, Training(precision=p), Parallel(dp=4), 8)
        assert op.itemsize == value_bytes(p)


# -- the schedule's virtual stages ----------------------------------------------------------------

def test_effective_virtual_stages():
    assert pipeline.effective_virtual_stages("interleaved", 3) == 3
    assert pipeline.effective_virtual_stages("1f1b", 3) == 1
    assert pipeline.effective_virtual_stages("gpipe", 2) == 1
    # the old sites: the bubble and the activations ignore v outside the interleaved schedule
    assert pipeline.bubble_fraction(4, 8, "1f1b", 2) == pipeline.bubble_fraction(4, 8, "1f1b", 1) == 3 / 11
    assert pipeline.bubble_fraction(4, 8, "interleaved", 2) == 3 / 19
    assert act.stage_activation_layers(8, 2, 4, "1f1b", 2) == act.stage_activation_layers(8, 2, 4, "1f1b", 1) == 8
    assert act.stage_activation_layers(8, 2, 4, "interleaved", 2) == 2 * pipeline.inflight(0, 2, 4, "interleaved", 2)


# -- the bubble's seconds -------------------------------------------------------------------------

def test_bubble_seconds():
    assert pipeline.bubble_seconds(3.0, 0.25) == 1.0
    assert pipeline.bubble_seconds(2.5, 0.0) == 0.0
    f = pipeline.bubble_fraction(4, 8)
    assert pipeline.bubble_seconds(8.0, f) == pytest.approx(8.0 * 3 / 8)        # (p-1)/m x compute


def test_the_planner_and_the_twin_price_the_bubble_alike():
    m, tr = model("gpt2"), Training(micro_batch=1, global_batch=8)
    t = step_time(m, tr, Parallel(pp=4), A100)
    f = pipeline.bubble_fraction(4, 8)
    assert t.bubble == (t.forward + t.backward) * f / (1 - f) == pipeline.bubble_seconds(t.compute, f)
    cfg = TrainConfig(model="nano", seq=32, micro_batch=1, pp=2, grad_accum=4, strategy="dp")
    s = twin_step.step_seconds(cfg, 2, [(1000, True)], {"flops": 1e9, "optimizer_s_per_param": 1e-8})
    f = twin_pipeline.bubble(cfg)
    assert f == 1 / 5
    assert s["bubble"] == s["compute"] * f / (1 - f) == pipeline.bubble_seconds(s["compute"], f)


# -- what each ZeRO stage shards ------------------------------------------------------------------

def test_every_stage_reads_the_table():
    assert [by_zero(z).name for z in range(4)] == list(STRATEGIES)
    sb = memory.state_bytes("bf16", "adam")
    for z in range(4):
        s = by_zero(z)
        params, grads, opt, _ = memory.model_states(100, sb, dp=4, zero=z)
        assert (params == 25 * 2, grads == 25 * 2, opt == 25 * 12) == (s.shard_params, s.shard_grads, s.shard_optimizer)
        assert (s.shard_params, s.shard_grads, s.shard_optimizer) == (z >= 3, z >= 2, z >= 1)
        assert s.reduces_every_micro_batch == (z >= 2)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_plan_table_says_what_the_stage_shards(zero):
    e = estimate(model("gpt2"), Training(micro_batch=1), Parallel(dp=4, zero=zero), A100)
    console = Console(record=True, width=200, file=open(os.devnull, "w"))
    console.print(plan_render.memory(e))
    lines = {line.split()[0]: line for line in console.export_text().splitlines()
             if line.split()[:1] in (["params"], ["grads"], ["optimizer"])}
    s = by_zero(zero)
    assert ["/ dp 4" in lines[k] for k in ("params", "grads", "optimizer")] == \
        [s.shard_params, s.shard_grads, s.shard_optimizer]


# -- the pipeline figure as an output -------------------------------------------------------------

def test_the_pipeline_plot_is_written_through_outputs(tmp_path, monkeypatch):
    seen, synced = [], []
    real_write, real_fsync = outputs.write_with, os.fsync
    monkeypatch.setattr(pipeline_plot, "write_with",
                        lambda path, writer, binary=False: seen.append(path) or real_write(path, writer, binary))
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    timeline = [[{"kind": a.kind, "micro": a.micro, "chunk": a.chunk, "start": s, "end": e}
                 for a, s, e in stage] for stage in pipeline.simulate(2, 2, "1f1b")]
    path = tmp_path / "step.png"
    pipeline_plot.plot(timeline, str(path))
    assert seen == [str(path)] and synced
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask      # an ordinary file, not mkstemp's 0600
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["step.png"]
