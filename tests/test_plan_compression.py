"""`ringzero plan --compress`: the dp gradient reduction with and without a compression scheme
(`plan.strategies.compression_plan`), against hand counts on a tiny model, its refusals (the same
reasons `ringzero train` gives), its JSON and where its break-even lies. No ranks: all planner."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ringzero import cli
from ringzero.plan import Parallel, Training, estimate, hardware, model
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.pipeline.layout import stage_params
from ringzero.plan.strategies.compression import Compression, powersgd_split
from ringzero.plan.strategies.compression import refusal
from ringzero.plan.strategies.compression_plan import busiest_stage, compression_plan, pack, rank_shapes
from ringzero.run.config import TrainConfig

pytestmark = pytest.mark.timeout(120)

TINY = ModelShape(layers=1, hidden=8, heads=2, kv_heads=1, vocab=16, seq=4, ffn=16, bias=False,
                  positions="rotary", norm="rmsnorm")
"""600 parameters: embedding 16x8; norm 8, Q 8x8, K and V 4x8 (one kv head of 4), O 8x8, norm 8, up
16x8, down 8x16; final norm 8 (tied head)."""
A100 = hardware("a100-80gb")


def _plan(c: Compression, precision: str = "bf16", m: ModelShape = TINY, hw=A100, **par):
    """The compression plan of `m` on 4 dp ranks in one node, ring all-reduce, one bucket."""
    p = {"dp": 4, "dp_algorithm": "ring", "bucket_mb": 1.0, **par}
    return compression_plan(estimate(m, Training(precision=precision), Parallel(**p), hw), c)


def _main(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the tensors and buckets ------------------------------------------------------------------------

def test_the_tiny_model_by_hand():
    shapes = rank_shapes(TINY)
    assert shapes == [(16, 8), (8,), (8, 8), (4, 8), (4, 8), (8, 8), (8,), (16, 8), (8, 16), (8,)]
    assert sum(math.prod(s) for s in shapes) == param_count(TINY).total == 600
    # rank 2: a matrix compresses when (n + m)·2·2 < n·m: 16x8 and 8x16 do, 8x8 and 4x8 do not
    assert powersgd_split(shapes, 2) == (16 * 2 + 16 * 2 + 8 * 2, 8 * 2 + 8 * 2 + 16 * 2, 64 + 32 + 32 + 64 + 24)


@pytest.mark.parametrize("name, tp, pp", [("llama-2-7b", 1, 1), ("llama-2-7b", 4, 1), ("llama-2-7b", 2, 4),
                                          ("gpt2", 1, 1), ("gpt2", 4, 3), ("llama-2-70b", 8, 10)])
def test_each_stage_holds_the_parameters_the_memory_model_counts(name, tp, pp):
    m = model(name)
    for stage in range(pp):
        assert sum(math.prod(s) for s in rank_shapes(m, tp, stage, pp)) == stage_params(m, tp, stage, pp)
    assert stage_params(m, tp, busiest_stage(m, tp, pp), pp) == max(stage_params(m, tp, s, pp) for s in range(pp))


def test_buckets_fill_in_reverse_order_as_the_engine_does():
    mib = 2**-20                                           # bucket_mb in bytes x 2^-20
    assert pack([(4,), (10,), (3,)], 1, 10 * mib) == [[(3,)], [(10,)], [(4,)]]
    assert pack([(4,), (10,), (3,)], 1, 14 * mib) == [[(3,), (10,)], [(4,)]]
    assert pack([(40,)], 1, 10 * mib) == [[(40,)]]          # a tensor larger than a bucket gets its own


# -- bytes on the wire, by hand ---------------------------------------------------------------------

RING = 2 * 3 / 4                                            # a ring all-reduce sends 2(n-1)/n of its buffer


@pytest.mark.parametrize("c, precision, plain, sent, calls", [
    (Compression("fp16"), "fp32", RING * 600 * 4, RING * 600 * 2, 1),
    (Compression("bf16"), "bf16", RING * 600 * 2, RING * 600 * 2, 1),          # already 2 bytes: nothing saved
    (Compression("powersgd", rank=2), "bf16", RING * 600 * 2, RING * (216 + 80 + 64) * 2, 3),
    (Compression("topk", fraction=0.05), "bf16", RING * 600 * 2, 3 / 4 * 4 * 30 * (4 + 2), 1),
])
def test_bytes_per_step_per_rank(c, precision, plain, sent, calls):
    cp = _plan(c, precision)
    assert (cp.buckets, cp.plain.calls, cp.wire.calls) == (1, 1, calls)
    assert (cp.plain.bytes, cp.wire.bytes) == (plain, sent)
    assert cp.ratio == plain / sent


def test_a_16_bit_cast_halves_fp32_gradients_exactly():
    for zero in (0, 1, 2):
        for name in ("fp16", "bf16"):
            cp = _plan(Compression(name), "fp32", model("gpt2"), zero=zero, bucket_mb=25.0)
            assert cp.ratio == 2 and cp.buckets > 1 and cp.extra_latency_s == 0


def test_zero1_reduce_scatters_plain_and_all_reduces_compressed():
    cp = _plan(Compression("powersgd", rank=2), zero=1)
    assert cp.strategy == "zero1" and cp.plain.bytes == 3 / 4 * 600 * 2 and cp.wire.bytes == RING * 360 * 2
    assert cp.state == {"residual": 600 * 2, "q": 64 * 2}


def test_the_plain_figure_is_the_plans_own_gradient_op():
    e = estimate(model("llama-2-7b"), Training(), Parallel(dp=16), A100)
    (op,) = [o for o in e.ops if o.kind == "dp"]
    cp = compression_plan(e, Compression("powersgd"))
    assert cp.plain.bytes == op.bytes_sent and cp.link == "network" and cp.stage == 0
    assert cp.compute_s > 0 and cp.flops > 0 and cp.extra_latency_s > 0        # 3 all-reduces per bucket, not 1


# -- where it pays ----------------------------------------------------------------------------------

def _slow_network(bw: float) -> dict:
    hw = dataclasses.replace(A100, gpus_per_node=4, inter_bw=bw)
    return dict(m=model("llama-2-7b"), hw=hw, dp=8, bucket_mb=25.0)


@pytest.mark.parametrize("c", [Compression("powersgd"), Compression("topk", fraction=0.01), Compression("fp16")])
def test_it_pays_below_the_break_even_bandwidth_and_loses_above(c):
    precision = "fp32" if c.scheme == "fp16" else "bf16"
    be = _plan(c, precision, **_slow_network(25e9)).break_even_bw
    assert 0 < be < math.inf
    assert _plan(c, precision, **_slow_network(be / 2)).saved_s > 0
    assert _plan(c, precision, **_slow_network(be * 2)).saved_s < 0


def test_a_cast_of_16_bit_gradients_never_pays():
    cp = _plan(Compression("fp16"), "bf16", **_slow_network(1e9))
    assert cp.break_even_bw is None and cp.saved_s < 0 and cp.break_even_bucket_bytes is None


def test_the_break_even_bucket_repays_the_extra_calls():
    cp = _plan(Compression("powersgd"), **_slow_network(5e9))
    size = cp.break_even_bucket_bytes
    assert 0 < size < math.inf and cp.saved_s > 0
    # per bucket: what it saves but for the latency, per byte, times the size, is the extra latency
    per_byte = (cp.saved_s + cp.extra_latency_s) / cp.gradient_bytes
    assert size * per_byte == pytest.approx(cp.extra_latency_s / cp.reductions)


# -- refusals and the command line --------------------------------------------------------------------

@pytest.mark.parametrize("scheme, strategy", [("fp16", "zero3"), ("powersgd", "zero2"), ("topk", "zero2"),
                                              ("bf16", "single"), ("powersgd", "ps")])
def test_refusals_are_the_reasons_train_gives(scheme, strategy):
    with pytest.raises(ValueError) as err:
        TrainConfig(strategy=strategy, compress=scheme, **({"servers": 1} if strategy == "ps" else {}))
    assert str(err.value) == f"compress={scheme} {refusal(scheme, strategy)}"
    assert refusal(scheme, "dp") is refusal(scheme, "zero1") is refusal("none", strategy) is None
    assert refusal("fp16", "zero2") is None


@pytest.mark.parametrize("argv, words", [
    (["--compress", "powersgd", "--zero", "2"], ["--compress=powersgd needs one reduction per step", "use zero1"]),
    (["--compress", "fp16", "--zero", "3"], ["--compress=fp16 runs with strategy dp, zero1, zero2, not 'zero3'"]),
    (["--compress", "topk", "--gpus", "1"], ["not 'single': one rank reduces nothing"]),
    (["--powersgd-rank", "2"], ["--powersgd-rank is powersgd's option: it needs compress=powersgd, not 'none'"]),
    (["--compress", "topk", "--topk-fraction", "0"], ["--topk-fraction=0.0 must be in (0, 1]"]),
    (["--compress", "powersgd", "--powersgd-rank", "0"], ["--powersgd-rank=0 must be an integer >= 1"]),
    (["--compress", "powersgd", "--powersgd-rank", "999"], ["--powersgd-rank=999 is larger", "allowed 1..768"]),
    (["--compress", "zip"], ["--compress='zip' is not a scheme; allowed: none, fp16, bf16, powersgd, topk"]),
])
def test_bad_compression_flags_are_one_line_exit_2(argv, words, capsys):
    code, out, err = _main(["plan", "--model", "gpt2", "--gpus", "8", *argv], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)


def test_json_has_the_compression_key(capsys):
    argv = ["plan", "--model", "llama-2-7b", "--gpus", "16", "--json"]
    code, out, _ = _main([*argv, "--compress", "powersgd", "--powersgd-rank", "4"], capsys)
    d = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    c = d["compression"]
    assert code == 0 and c["scheme"] == "powersgd" and c["rank"] == 4 and c["fraction"] is None
    assert c["uncompressed"]["bytes"] == d["comm"]["dp"] > c["compressed"]["bytes"] > 0
    assert set(c) >= {"ratio", "compute_seconds", "extra_latency_seconds", "saved_seconds", "break_even_bandwidth",
                      "pays", "break_even_bucket_bytes", "state_bytes"}
    assert "compression" not in json.loads(_main(argv, capsys)[1])


def test_the_table_is_printed(capsys):
    code, out, err = _main(["plan", "--model", "gpt2", "--gpus", "16", "--precision", "fp32", "--compress", "bf16"],
                           capsys)
    assert code == 0, err
    assert "Gradient compression: bf16 cast on the dp gradient reduction of 16 dp ranks" in out
    for row in ("bytes sent, GB", "ratio 2", "compute seconds", "break-even network bandwidth", "break-even bucket"):
        assert row in out, row


def test_the_sweeps_break_even_is_the_fitted_lines_crossing():
    """`bench.compress_sweep`: each scheme's predicted communication fitted as a + b/G; B* where the
    compressed line crosses the plain one, and a cell predicted faster exactly below it."""
    from ringzero.bench.compress_sweep import fit, judge
    a, b = fit([(g, 0.01 + 2e6 / g) for g in (5e7, 2e8, 1e9, 5e9)])
    assert a == pytest.approx(0.01) and b == pytest.approx(2e6)
    cells = {}
    for g in (0.05, 0.2, 1.0, 5.0):
        plain, comp = 0.01 + 4e6 / (g * 1e9), 0.02 + 1e6 / (g * 1e9)      # B* = 3e6 / 0.01 = 0.3 GB/s
        cells[(2, g, "none")] = {"comm_s": plain, "step_s": 0.1 + plain, "final_loss": 1.0}
        cells[(2, g, "powersgd")] = {"comm_s": comp, "step_s": 0.1 + comp, "final_loss": 1.0}
    rows = judge(cells)
    assert all(r["break_even_gbps"] == pytest.approx(0.3) for r in rows)
    assert [r["predicted_faster"] for r in rows] == [True, True, False, False]
    assert all(r["right"] for r in rows)
