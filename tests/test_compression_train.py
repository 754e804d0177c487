"""Gradient compression in training runs (`parallel.compression` under DP and ZeRO-1/2): its twins
exact on 2 and 3 ranks, ZeRO-1 composing with PowerSGD and top-k (the same update as DP's), a
skipped fp16 step leaving the hooks' state as it was, a resumed run continuing bit for bit, and
bad input refused before any rank starts."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ringzero.plan.strategies.compression import state_bytes
from ringzero.run import compress_options
from ringzero.run.compress_options import CompressConfig
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank
from ringzero.twin import compression as compression_twins
from ringzero.twin import predict
from cli_errors import forbid_ranks, train_fails

BASE = dict(model="nano", seq=16, micro_batch=1, steps=3, max_bytes=65536, eval_every=1000, eval_batches=1,
            bucket_mb=0.25, compress_start=1)
CASES = (("fp16", "dp"), ("bf16", "zero1"), ("fp16", "zero2"), ("powersgd", "dp"), ("powersgd", "zero1"),
         ("topk", "dp"), ("topk", "zero1"))


def _cfg(scheme, strategy, **kw):
    extra = {"powersgd": {"powersgd_rank": 2}, "topk": {"topk_fraction": 0.05}}.get(scheme, {})
    return TrainConfig(**{**BASE, **extra, **kw}, compress=scheme, strategy=strategy)


def _train(group, configs, keep=False):
    return [train_rank(c, group=group, keep_params=keep, calibrate=False) for c in configs]


def _sent(traffic):
    return sum(op["bytes_sent"] for op in traffic["ops"].values())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_bytes_and_state_are_predicted_exactly(pool, world):
    configs = [_cfg(s, st) for s, st in CASES]
    per_rank = pool.run(_train, configs, world=world)
    for i, cfg in enumerate(configs):
        results = [rr[i] for rr in per_rank]
        plain = dataclasses.replace(cfg, compress=CompressConfig())
        c = compress_options.compression(cfg)
        for r in results:
            case = (cfg.compress.compress, cfg.parallel.strategy, world, r.rank)
            assert predict.traffic(cfg, world, r.buckets, r.rank)["bytes_sent"] == _sent(r.traffic), case
            assert predict.traffic(plain, world, r.buckets, r.rank)["bytes_sent"] == _sent(r.traffic_plain), case
            assert _sent(r.traffic) < _sent(r.traffic_plain), case
            held = state_bytes(c, [b[2] for b in r.buckets], cfg.value_bytes, cfg.optim.precision == "fp16")
            assert r.compress == held, case
            assert (held["residual"] > 0) == c.stateful and (held["q"] > 0) == (c.scheme == "powersgd"), case
        rows = {t.name: t for t in compression_twins.twins(cfg, world, results, {})}   # no probe: no step twin
        ratio = next(t for name, t in rows.items() if name.startswith("compression ratio"))
        assert ratio.error == 0.0 and ratio.predicted > 1.0


def test_fp16_halves_the_dp_all_reduce():
    buckets = [(1000, False, [(10, 100)])]
    for world in (2, 4, 8):
        full = predict.calls(TrainConfig(model="nano", strategy="dp"), world, buckets)
        half = predict.calls(TrainConfig(model="nano", strategy="dp", compress="fp16"), world, buckets)
        assert [c[2] for c in full] == [4] and [c[2] for c in half] == [2]
        assert [c[1] for c in full] == [c[1] for c in half]


@pytest.mark.timeout(240)
def test_zero1_composes_with_powersgd_and_topk(pool):
    """ZeRO-1 runs the hook on the whole bucket and keeps its shard of the sum: with clipping off
    (its norm is summed in another order over shards) the weights equal DP's with the same hook."""
    configs = [_cfg(s, st, clip=None) for s in ("powersgd", "topk") for st in ("dp", "zero1")]
    per_rank = pool.run(_train, configs, True, world=2)
    for i in (0, 2):
        dp, z1 = per_rank[0][i].params, per_rank[0][i + 1].params
        assert dp.keys() == z1.keys()
        for k in dp:
            assert dp[k] == z1[k], (configs[i].compress.compress, k)


@pytest.mark.timeout(240)
def test_an_overflow_in_a_compressed_bucket_is_skipped_and_leaves_the_state(pool):
    """An inf in rank 1's gradient at step 2 reaches every rank through each hook, so the loss
    scaler skips that step; had the hook kept the inf in its residual (or Q), every later step would
    overflow too. (Step 0 overflows on its own: the initial scale 2^16 is too large for this model's
    fp16 gradients, as in the uncompressed run.)"""
    configs = [_cfg(s, "dp", precision="fp16", steps=5, inject_nonfinite=(1, 2)) for s in ("fp16", "powersgd", "topk")]
    per_rank = pool.run(_train, configs, world=2)
    for i, cfg in enumerate(configs):
        for r in (rr[i] for rr in per_rank):
            assert r.skipped == 2, (cfg.compress.compress, r.skipped)
            assert r.nonfinite[1:] == [(2, [1])] and r.nonfinite[0][0] == 0, (cfg.compress.compress, r.nonfinite)


@pytest.mark.timeout(240)
def test_resume_continues_bit_for_bit(pool, tmp_path):
    """Saved after step 2 (residuals and Q with it, per rank) and resumed to step 4, PowerSGD and
    top-k give the weights of the run that never stopped."""
    out = []
    for scheme, strategy in (("powersgd", "dp"), ("topk", "zero1")):
        d = tmp_path / scheme
        whole = _cfg(scheme, strategy, steps=4, compress_start=1)
        first = dataclasses.replace(whole, save_dir=str(d), save_every=2)
        resumed = dataclasses.replace(whole, resume=str(d / "step-00000002"))
        out.append((whole, first, resumed))
    per_rank = pool.run(_train, [c for trio in out for c in trio[:2]], True, world=2)
    rebucketed = [dataclasses.replace(trio[2], bucket_mb=0.5) for trio in out]   # the saved residuals do not fit
    again = pool.run(_train, [trio[2] for trio in out] + rebucketed, True, world=2)
    for j, (whole, *_rest) in enumerate(out):
        for rank in range(2):
            assert again[rank][j].params == per_rank[rank][2 * j].params, (whole.compress.compress, rank)
            assert again[rank][j].losses == per_rank[rank][2 * j].losses[2:]
            fresh = again[rank][len(out) + j]              # resumed with no residual: runs, and differs
            assert all(map(math.isfinite, fresh.losses)) and fresh.params != per_rank[rank][2 * j].params


@pytest.mark.parametrize("argv,words", [
    (["--compress", "gzip"], ("compress", "gzip", "powersgd", "topk")),
    (["--compress", "powersgd", "--strategy", "zero3"], ("compress", "zero3", "qgZ")),
    (["--compress", "fp16", "--strategy", "single"], ("compress", "single")),
    (["--compress", "fp16", "--strategy", "ps"], ("compress", "ps")),
    (["--compress", "topk", "--strategy", "zero2"], ("ZeRO-2", "zero1")),
    (["--compress", "powersgd", "--powersgd-rank", "0"], ("powersgd_rank", ">= 1")),
    (["--compress", "powersgd", "--powersgd-rank", "100000"], ("powersgd_rank", "compresses no matrix", "allowed 1..")),
    (["--compress", "topk", "--tp", "2"], ("tp=2", "LayerNorm")),
    (["--compress-start", "3"], ("compress_start", "powersgd")),
    (["--compress", "topk", "--topk-fraction", "0"], ("topk_fraction", "(0, 1]")),
    (["--compress", "topk", "--topk-fraction", "1.5"], ("topk_fraction", "(0, 1]")),
    (["--compress", "fp16", "--compress-start", "-1"], ("compress_start", ">= 0")),
    (["--compress", "fp16", "--compress-start", "50", "--steps", "10"], ("compress_start", "beyond", "0..9")),
    (["--powersgd-rank", "4"], ("powersgd_rank", "compress=powersgd")),
])
def test_bad_compression_input_is_one_line_exit_2(capsys, tmp_path, monkeypatch, argv, words):
    forbid_ranks(monkeypatch)
    train_fails(capsys, tmp_path, ["--nproc", "2", *argv], *words)


def _wrapped(group, strategy, hook_name, steps=4, state=None, start=0):
    """An MLP under `ringzero.parallel.wrap` with a hook registered, as on DDP."""
    import torch
    from torch import nn
    from ringzero.parallel import AdamConfig, wrap
    from ringzero.parallel.compression import Cast16, PowerSGD, TopK
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))
    engine = wrap(model, strategy=strategy, optimizer=AdamConfig(lr=1e-2), group=group, bucket_mb=0.01)
    from ringzero.parallel.compression import Starting
    engine.register_comm_hook({"fp16": lambda: Cast16("fp16"), "powersgd": lambda: PowerSGD(2, seed=3),
                               "topk": lambda: TopK(0.1),
                               "powersgd-late": lambda: Starting(PowerSGD(2, seed=3), 4)}[hook_name]())
    if state is not None:
        engine.load_state_dict(state)
    rank = torch.distributed.get_rank(group)
    for step in range(start, start + steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * rank + step))
        engine.backward((engine(x) - x.sum(1, keepdim=True)).pow(2).mean())
        engine.step()
    out = [(t.name, t.predicted, t.measured) for t in engine.twins()], engine.state_dict()
    engine.close()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy,hook", [("dp", "powersgd"), ("zero1", "topk"), ("zero2", "fp16"),
                                           ("dp", "powersgd-late")])
def test_a_hook_on_a_wrapped_model_has_its_twins_and_resumes(pool, strategy, hook):
    """The twins hold after the last of 4 steps ("powersgd-late" starts at step 4: the last step
    is the plain reduction's, and the resumed run's two steps PowerSGD's)."""
    runs = pool.run(_wrapped, strategy, hook, world=2)
    for twins, _ in runs:
        by = {name: (p, m) for name, p, m in twins}
        assert by["bytes sent per step"][0] == by["bytes sent per step"][1] > 0, by
        held = [name for name in by if name.startswith(hook)]
        assert (len(held) > 0) == (hook in ("powersgd", "topk")), by
        for name in held:
            assert by[name][0] == by[name][1] > 0, (name, by[name])
    whole = pool.run(_wrapped, strategy, hook, 6, world=2)
    states = [sd for _, sd in runs]
    again = pool.run(_resume, strategy, hook, states, world=2)
    for (_, w), (_, a) in zip(whole, again):
        assert all(w["model"][k].equal(a["model"][k]) for k in w["model"]), (strategy, hook)


def _resume(group, strategy, hook, states):
    import torch
    return _wrapped(group, strategy, hook, 2, states[torch.distributed.get_rank(group)], start=4)


def test_topk_selection_by_sampling_is_the_exact_top_k():
    """The sampled threshold (Deep Gradient Compression's) selects the same entries as torch.topk,
    and an inf or NaN anywhere is selected (so it reaches the sum and the loss scaler)."""
    import math
    import torch
    from ringzero.parallel.compression.topk import SAMPLE, largest
    g = torch.Generator().manual_seed(0)
    for n, f in ((5 * SAMPLE + 17, 0.01), (5 * SAMPLE, 0.2), (300, 0.5)):
        a = torch.randn(n, generator=g).abs()
        k = math.ceil(f * n)
        assert set(largest(a, k).tolist()) == set(torch.topk(a, k).indices.tolist()), (n, f)
    a = torch.randn(5 * SAMPLE, generator=g).abs()
    a[12345], a[54321] = float("nan"), float("inf")
    picked = set(largest(a, 100).tolist())
    assert {12345, 54321} <= picked


def test_hook_edge_cases_alone():
    """Without ranks (`LocalLink`: every rank holds this one's tensors): fp16's cast cannot overflow
    where the mean would not; an fp16 residual is kept in fp32, so doubling the loss scale cannot
    make it inf; a zero matrix gradient stays zero through PowerSGD's orthogonalisation; the start
    step travels with the hook's state."""
    import torch
    from ringzero.parallel.compression import Cast16, PowerSGD, Starting, TopK
    from ringzero.parallel.compression.bucket import GradBucket, LocalLink

    def bucket(values, shapes):
        t = torch.tensor(values) if not isinstance(values, torch.Tensor) else values
        offsets = [0]
        for s in shapes:
            offsets.append(offsets[-1] + math.prod(s))
        return GradBucket(0, t, offsets, [torch.Size(s) for s in shapes])

    b = bucket([1e5, 1.0], [(2,)])
    Cast16("fp16").reduce(b, LocalLink(4))
    assert torch.isfinite(b.buffer).all() and abs(float(b.buffer[0]) - 1e5) <= 1e5 * 2 ** -10   # fp16 rounding

    hook = TopK(0.5)
    b = bucket(torch.tensor([34000.0, 40000.0, 1.0, 1.0], dtype=torch.float16), [(4,)])
    hook.reduce(b, LocalLink(1))
    hook.settle(False, rescale=2.0)
    assert hook.residuals.kept[0].dtype == torch.float32 and torch.isfinite(hook.residuals.kept[0]).all()

    p = Starting(PowerSGD(2), 0)
    b = bucket(torch.zeros(64), [(8, 8)])
    p.reduce(b, LocalLink(2))
    assert torch.equal(b.buffer, torch.zeros(64))
    p.settle(False)
    again = Starting(PowerSGD(2), 5)
    again.load_state_dict(p.state_dict())
    assert again.step == 1 and again.inner.qs.kept.keys() == {0}



@pytest.mark.timeout(240)
def test_powersgd_under_tensor_parallelism_keeps_replicated_weights_alike(pool):
    """tp 2 x dp 2: PowerSGD compresses matrix by matrix (each tp rank's shards and the weights every
    tp rank holds alike, in buckets of the same shapes, with the same first Q) and sends the vectors
    plain, so the weights both tp ranks hold stay equal: each rank's full view of every parameter
    (its shards gathered over tp, its own copy of a replicated one) is the same on both."""
    configs = [_cfg("powersgd", "zero1", tp=2, steps=3, sequence_parallel=sp) for sp in (False, True)]
    per_rank = pool.run(_train, configs, True, world=4)
    for i, cfg in enumerate(configs):
        for a, b in ((0, 1), (2, 3)):                   # the tp pairs (tp varies fastest)
            pa, pb = per_rank[a][i].params, per_rank[b][i].params
            assert pa.keys() == pb.keys()
            assert [k for k in pa if pa[k] != pb[k]] == [], cfg.parallel.sequence_parallel


@pytest.mark.timeout(240)
def test_under_a_pipeline_the_tied_embedding_stays_tied(pool):
    """pp 2 x dp 2: the token embedding, used by the first stage's input and the last stage's head,
    gets a bucket of its own on both (`FlatStrategy.alone`, drawn alike by PowerSGD), so PowerSGD and
    top-k reduce its two copies alike and they stay equal; the bytes are the planner's exactly."""
    configs = [_cfg(s, "dp", pp=2, grad_accum=2, steps=3, bucket_mb=1.0) for s in ("powersgd", "topk")]   # 1 MiB: the embedding shares a bucket
    per_rank = pool.run(_train, configs, True, world=4)
    for i, cfg in enumerate(configs):
        at = [cfg.placement(4).coords(r) for r in range(4)]
        for r in range(4):
            res = per_rank[r][i]
            assert predict.traffic(cfg, 4, res.buckets, res.rank)["bytes_sent"] == _sent(res.traffic), (cfg.compress, r)
        for first in (r for r in range(4) if at[r]["pp"] == 0):
            last = next(r for r in range(4) if at[r]["pp"] == 1 and at[r]["dp"] == at[first]["dp"])
            a, b = per_rank[first][i].params["wte.weight"], per_rank[last][i].params["wte.weight"]
            assert a == b, (cfg.compress.compress, first, last)
