"""Pipeline schedules in the planner: the simulated bubble against the closed form, the activations
each stage holds, the checks, the interleaved schedule in `estimate`, the boundary traffic under
tensor parallelism, the `ringzero plan` flags and the engine's automatic layout."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero import cli
from ringzero.plan.model import activations as act
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.config import Parallel, Training
from ringzero.plan.estimate import estimate
from ringzero.plan.hardware import hardware
from ringzero.plan.strategies.memory import buffer_bytes, memory
from ringzero.plan.model.presets import model
from ringzero.plan.search.recommend import engine_layout, engine_runs
from ringzero.plan.search.space import Space, search
from ringzero.plan.strategies.traffic import pipeline_ops

LLAMA7, NANO, H100 = model("llama-2-7b"), model("nano"), hardware("h100-sxm")


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 4), groups=st.integers(1, 4), v=st.integers(1, 3),
       schedule=st.sampled_from(pipeline.SCHEDULES))
def test_simulated_bubble_is_the_closed_form(p, groups, v, schedule):
    v = v if schedule == "interleaved" else 1
    m = groups * p if schedule == "interleaved" else groups
    pipeline.check(p, p * v, m, schedule, v)
    timeline = pipeline.simulate(p, m, schedule, v)
    assert pipeline.idle_fraction(timeline) == pytest.approx(pipeline.bubble_fraction(p, m, schedule, v))


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_inflight_micro_batches_per_stage(p, m):
    for i in range(p):
        assert act.inflight_microbatches(p, m, "gpipe", stage=i) == m
        assert act.inflight_microbatches(p, m, "1f1b", stage=i) == min(p - i, m)
    # Interleaved (in chunk micro-batches): the warm-up of 2(p-1) + (v-1)p forwards, plus one.
    assert act.inflight_microbatches(p, m * p, "interleaved", 2) == min(2 * (p - 1) + p + 1, 2 * m * p)
    assert act.inflight_microbatches(1, m, "gpipe") == 1        # no pipeline: accumulation frees each


def test_interleaved_first_stage_holds_more_than_1f1b():
    # 24 layers on 4 stages, 8 micro-batches: 1F1B holds 4 micro-batches of 6 layers; interleaved
    # (v = 2) 11 chunk micro-batches of 3 layers, 1 + (p-1)/(p·v) = 1.375 times as much.
    assert act.stage_activation_layers(24, 4, 8, "1f1b") == 24
    assert act.stage_activation_layers(24, 4, 8, "interleaved", 2) == 33
    f = [act.activation_bytes(LLAMA7, 1, 128, pp=4, microbatches=8, stage=i) for i in range(4)]
    assert f == sorted(f, reverse=True) and f[0] == 4 * f[3]     # min(p - i, m): 4, 3, 2, 1
    tr = Training(global_batch=8)
    one = memory(LLAMA7, tr, Parallel(pp=4)).activations
    two = memory(LLAMA7, tr, Parallel(pp=4, schedule="interleaved", virtual_stages=2)).activations
    assert two == pytest.approx(one * 11 * 4 / (4 * 8), abs=1)   # 11 x 4 layers vs 4 x 8


@pytest.mark.parametrize("args, message", [
    ((4, 8, 4, "zero-bubble"), "allowed: gpipe, 1f1b, interleaved"),
    ((4, 8, 4, "1f1b", 2), "need the interleaved schedule"),
    ((4, 6, 4, "interleaved", 2), "more than the 6 layers"),
    ((4, 8, 6, "interleaved", 2), "multiple of pp=4"),
    ((0, 8, 4, "1f1b"), "pp must be an integer >= 1"),
])
def test_check_rejects_in_one_line(args, message):
    with pytest.raises(ValueError, match=message) as err:
        pipeline.check(*args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kw, message", [
    (dict(pp=4, virtual_stages=0), "virtual_stages must be an integer >= 1"),
    (dict(pp=4, virtual_stages=2), "needs schedule 'interleaved'"),
    (dict(schedule="interleaved"), "needs pp > 1"),
])
def test_parallel_validates_virtual_stages(kw, message):
    with pytest.raises(ValueError, match=message) as err:
        Parallel(**kw)
    assert "\n" not in str(err.value)


def test_interleaving_cuts_the_bubble_in_estimate():
    tr = Training(global_batch=8)
    plain = estimate(LLAMA7, tr, Parallel(pp=4), H100)
    inter = estimate(LLAMA7, tr, Parallel(pp=4, schedule="interleaved", virtual_stages=2), H100)
    assert plain.time.bubble_fraction == pytest.approx(3 / 11)
    assert inter.time.bubble_fraction == pytest.approx(3 / 19)          # (p-1)/(v·m+p-1)
    assert inter.time.bubble == pytest.approx(inter.time.compute * 3 / 16)
    assert inter.time.bubble < plain.time.bubble
    assert inter.comm_bytes("pp") == 2 * plain.comm_bytes("pp")          # a message per chunk
    with pytest.raises(ValueError, match="multiple of pp=4"):
        estimate(LLAMA7, Training(global_batch=6), Parallel(pp=4, schedule="interleaved"), H100)
    with pytest.raises(ValueError, match="more than the 32 layers"):
        estimate(LLAMA7, tr, Parallel(pp=4, schedule="interleaved", virtual_stages=16), H100)


@pytest.mark.parametrize("sp", [False, True])
def test_boundary_traffic_is_split_over_tp(sp):
    b, s, h, k = 2, 2048, 4096, 2
    m, tr = dataclasses.replace(LLAMA7, seq=s), Training(micro_batch=b, global_batch=4 * b)
    (alone,) = pipeline_ops(m, tr, Parallel(pp=4), 8)
    split, *gather = pipeline_ops(m, tr, Parallel(tp=4, pp=4, sequence_parallel=sp), 8)
    assert alone.bytes_sent == pipeline.boundary_bytes(4, b, s, h, k)       # a middle stage, both ways
    assert split.bytes_sent == pipeline.boundary_bytes(4, b, s, h, k, 4) == alone.bytes_sent / 4
    # Scatter/gather rebuilds each arriving slice with an all-gather over tp; sequence parallelism
    # keeps the slice (Narayanan et al. 2021 §4.1; Korthikanti et al. 2022 §4.2.2).
    assert len(gather) == (0 if sp else 1)
    if gather:
        assert (gather[0].kind, gather[0].collective, gather[0].calls) == ("tp", "all_gather", split.calls)
        assert gather[0].bytes_sent == split.calls * 3 / 4 * b * s * h * k and not gather[0].spans_nodes
    assert buffer_bytes(m, tr, Parallel(tp=4, pp=4, sequence_parallel=sp)) == 2 * b * s * h * k // 4


def _main(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_interleaved(capsys):
    argv = ["plan", "--model", "llama-2-7b", "--pp", "4", "--schedule", "interleaved", "--virtual-stages", "2",
            "--global-batch", "8"]
    code, out, err = _main(argv, capsys)
    assert code == 0, err
    assert "interleaved, v=2" in out
    code, out, err = _main([*argv, "--json"], capsys)
    d = json.loads(out)
    assert d["inputs"]["parallel"]["virtual_stages"] == 2 and d["bubble_fraction"] == pytest.approx(3 / 19)


@pytest.mark.parametrize("extra, message", [
    (["--schedule", "interleaved", "--virtual-stages", "0"], "--virtual-stages must be an integer >= 1"),
    (["--virtual-stages", "2"], "--virtual-stages=2 needs schedule 'interleaved'"),
    (["--schedule", "interleaved", "--virtual-stages", "2", "--global-batch", "6"],
     "--global-batch (6) must be a multiple of micro-batch x dp x pp = 4"),
    (["--schedule", "interleaved", "--virtual-stages", "16", "--global-batch", "8"], "more than the 32 layers"),
    (["--schedule", "zb"], "--schedule='zb' is not supported"),
])
def test_cli_bad_pipeline_flags_exit_2_in_one_line(extra, message, capsys):
    code, out, err = _main(["plan", "--model", "llama-2-7b", "--pp", "4", *extra], capsys)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_search_tries_interleaved_only_where_it_runs():
    space = Space(micro_batches=(1,), zero=(0,), recompute=("none",), schedules=("1f1b", "interleaved"))
    r = search(NANO, Training(global_batch=8), H100, 4, space=space, top=100)
    seen = {(e.parallel.pp, e.parallel.schedule, e.parallel.virtual_stages) for e in r.best}
    assert (2, "interleaved", 2) in seen and (2, "1f1b", 1) in seen
    assert all(e.parallel.schedule != "interleaved" or e.parallel.pp * 2 <= NANO.layers for e in r.best)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_engine_layout_for_nano(world):
    tr = Training(micro_batch=8)
    par = engine_layout(NANO, tr, world, hardware("a100-80gb"))
    assert par.gpus == world and engine_runs(NANO, par)
    assert NANO.heads % par.tp == 0 and NANO.ffn_dim % par.tp == 0 and par.pp <= NANO.layers
    assert par.pp == 1 or par.zero <= 1
    assert Training(micro_batch=8, global_batch=8 * world).accumulation(par.dp) >= 1


def test_engine_layout_keeps_zero_2_and_3_off_pipelines():
    keep = lambda par: engine_runs(NANO, par)  # noqa: E731
    r = search(NANO, Training(), H100, 8, space=Space(zero=(2, 3)), top=1000, keep=keep)
    assert r.best and all(e.parallel.pp == 1 for e in r.best)
    tiny = dataclasses.replace(H100, hbm_bytes=1000)
    with pytest.raises(ValueError, match="no layout of nano fits on 2 GPUs") as err:
        engine_layout(NANO, Training(), 2, tiny)
    assert "\n" not in str(err.value)


def test_interleaved_with_one_chunk_is_1f1b():
    """v = 1 leaves nothing to interleave: the same actions as 1F1B on every stage."""
    from ringzero.plan.pipeline import schedule as pipeline
    for p in (2, 3, 4):
        for m in (p, 2 * p):
            for i in range(p):
                assert pipeline.actions(i, p, m, "interleaved", 1) == pipeline.actions(i, p, m, "1f1b")


def test_messages_and_held_bytes_follow_the_actions():
    """A middle stage of 1F1B receives and sends one activation and one gradient per micro-batch; the
    first sends no gradient, the last no activation; under interleaving every chunk boundary is
    crossed (v per micro-batch each way, minus the model's two ends). Held bytes weight each chunk."""
    from ringzero.plan.pipeline import schedule as pipeline
    m = 5
    n = [pipeline.messages(i, 3, m, "1f1b") for i in range(3)]
    assert n[1] == dict(activations_sent=m, activations_received=m, gradients_sent=m, gradients_received=m)
    assert n[0]["gradients_sent"] == n[0]["activations_received"] == 0 and n[0]["activations_sent"] == m
    assert n[2]["activations_sent"] == n[2]["gradients_received"] == 0
    inter = [pipeline.messages(i, 2, 4, "interleaved", 2) for i in range(2)]
    assert sum(x["activations_sent"] for x in inter) == 4 * (2 * 2 - 1)
    assert pipeline.held_at_peak(0, 2, 4, "gpipe", sizes=[3.0, 5.0]) == 4 * 3.0
    assert pipeline.held_at_peak(1, 2, 4, "1f1b", sizes=[3.0, 5.0]) == 5.0


def _partition_every_start(costs, chunks, first=0.0, last=0.0):
    """The reference: the same dynamic programme trying every start of every chunk."""
    n, prefix = len(costs), [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    cost = lambda k, a, b: prefix[b] - prefix[a] + (first if k == 0 else 0.0) + (last if k == chunks - 1 else 0.0)  # noqa: E731
    best = [[math.inf] * (n + 1) for _ in range(chunks)]
    cut = [[0] * (n + 1) for _ in range(chunks)]
    for j in range(1, n + 1):
        best[0][j] = cost(0, 0, j)
    for k in range(1, chunks):
        for j in range(k + 1, n + 1):
            for a in range(k, j):
                c = max(best[k - 1][a], cost(k, a, j))
                if c < best[k][j] - 1e-12:
                    best[k][j], cut[k][j] = c, a
    bounds, j = [n], n
    for k in range(chunks - 1, 0, -1):
        j = cut[k][j]
        bounds.append(j)
    return [range(a, b) for a, b in zip([0, *reversed(bounds)][:-1], [*reversed(bounds)])]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=40), st.data())
def test_the_bisected_partition_is_the_exhaustive_one(costs, data):
    """`partition` finds each chunk's start by bisection; it cuts exactly as trying every start."""
    costs = [float(c) for c in costs]
    chunks = data.draw(st.integers(1, len(costs)))
    first, last = data.draw(st.integers(0, 30)), data.draw(st.integers(0, 60))
    assert pipeline.partition(costs, chunks, first, last) == _partition_every_start(costs, chunks, first, last)
