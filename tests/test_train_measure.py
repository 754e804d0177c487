"""The engine's measurements equal the planner's predictions: model-state bytes,
bytes on the wire per step, and bytes saved for backward.

- Memory: `RankResult.held` (params, grads, optimizer; tensor sizes, padding included) against
  `predict.states(cfg, world)`, the ZeRO formulas (Rajbhandari et al. 2020). Each flat bucket is padded to
  a multiple of the ranks (`FlatBucket`), so measured - predicted is in [0, buckets x world x
  bytes per element) for every state (0 exactly under DP, which pads nothing).
- Traffic: the bytes the meter counted in the measured step, summed over its collectives, equal
  `predict.traffic(cfg, world, buckets, rank)` exactly, per rank, for dp and ZeRO-1/2/3, algorithm
  "ring" and "auto", grad_accum 1 and 2 (ZeRO-2/3 reduce-scatter every micro-batch); and the
  Φ-level shape: DP with one bucket sends 2(N-1)/N·Φ up to the chunk rounding; ZeRO-3 sends about
  1.5x ZeRO-1 (3Φ against 2Φ; less, by the root bucket's second all-gather that ZeRO-3 skips).
- Activations: `RankResult.activations` within 10 % of `predict.activations(cfg)`.
"""

from __future__ import annotations

import itertools

import pytest
import torch.distributed as dist

from ringzero.plan.comm.volume import Volume
from ringzero.plan.model.shapes import param_count
from ringzero.twin import predict
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank

STRATEGIES = ("dp", "zero1", "zero2", "zero3")
BASE = dict(model="nano", seq=16, micro_batch=1, steps=2, max_bytes=65536, eval_every=1000,
            eval_batches=1)


def _measure(group, cfg: TrainConfig):
    r = train_rank(cfg, group=group, calibrate=False)
    metered = sum((Volume(**op) for op in r.traffic["ops"].values()), Volume())
    return {"rank": r.rank, "held": r.held, "buckets": r.buckets, "sent": metered.bytes_sent,
            "recv": metered.bytes_recv, "activations": r.activations, "gathered": r.gathered}


_RUNS: dict[tuple[TrainConfig, int], list[dict]] = {}


def _run(pool, world: int, **kw) -> tuple[TrainConfig, list[dict]]:
    """Every rank's measurements of one run (cached: the memory and traffic tests share runs)."""
    cfg = TrainConfig(**{**BASE, **kw})
    if (cfg, world) not in _RUNS:
        _RUNS[cfg, world] = pool.run(_measure, cfg, world=world)
    return cfg, _RUNS[cfg, world]


# -- memory ----------------------------------------------------------------------------------------

MEMORY_CASES = [(s, w, "fp32") for s in STRATEGIES for w in (2, 3, 4)] + [(s, 3, "bf16") for s in STRATEGIES]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy,world,precision", MEMORY_CASES)
def test_held_bytes_equal_zero_formula(pool, strategy, world, precision):
    cfg, results = _run(pool, world, strategy=strategy, precision=precision, comm_algorithm="auto")
    predicted = predict.states(cfg, world)
    mixed = precision != "fp32"
    per_element = {"params": 2 if mixed else 4, "grads": 2 if mixed else 4, "optimizer": 12 if mixed else 8}
    for r in results:
        buckets = len(r["buckets"])
        assert sum(n for n, *_ in r["buckets"]) == param_count(cfg.shape).total
        for state, nbytes in per_element.items():
            diff = r["held"][state] - predicted[state]
            bound = buckets * world * nbytes           # padding: < `world` elements per bucket
            assert 0 <= diff < bound, (f"rank {r['rank']} {state}: held {r['held'][state]} vs ZeRO formula "
                                       f"{predicted[state]:.0f} (padding bound {bound})")
            if strategy == "dp":
                assert diff == 0, f"DP pads nothing, yet {state} differs by {diff} bytes"


# -- traffic ---------------------------------------------------------------------------------------

TRAFFIC_CASES = [(s, w, a, k) for s, w, a, k in itertools.product(STRATEGIES, (2, 3), ("ring", "auto"), (1, 2))]
TRAFFIC_CASES += [(s, 4, "auto", 1) for s in STRATEGIES]


def _check_traffic(cfg, world, results):
    for r in results:
        want = predict.traffic(cfg, world, r["buckets"], r["rank"])
        got = {"bytes_sent": r["sent"], "bytes_recv": r["recv"]}
        assert got == want, f"{cfg.parallel.strategy} {cfg.parallel.comm_algorithm} accum={cfg.training.grad_accum} rank {r['rank']}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy,world,algorithm,accum", TRAFFIC_CASES)
def test_traffic_equals_prediction(pool, strategy, world, algorithm, accum):
    cfg, results = _run(pool, world, strategy=strategy, comm_algorithm=algorithm, grad_accum=accum)
    _check_traffic(cfg, world, results)


@pytest.mark.timeout(120)
def test_traffic_equals_prediction_bf16(pool):
    """16-bit buckets move 2 bytes per element (the norm all-reduce stays one fp32)."""
    for strategy in STRATEGIES:
        cfg, results = _run(pool, 3, strategy=strategy, precision="bf16", comm_algorithm="auto")
        _check_traffic(cfg, 3, results)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", (2, 3, 4))
def test_dp_one_bucket_sends_ring_volume(pool, world):
    """Ring all-reduce of one bucket of Φ bytes: 2(N-1) chunk sends of Φ/N each, rounded to elements."""
    cfg, results = _run(pool, world, strategy="dp", comm_algorithm="ring", bucket_mb=64.0)
    phi = param_count(cfg.shape).total * 4
    for r in results:
        assert len(r["buckets"]) == 1
        ideal = 2 * (world - 1) / world * phi
        for way in ("sent", "recv"):     # uneven chunks: a rank may receive other sizes than it sends
            assert abs(r[way] - ideal) <= 2 * (world - 1) * 4, (r["rank"], way, r[way], ideal)
    _check_traffic(cfg, world, results)


@pytest.mark.timeout(120)
def test_zero3_sends_about_one_and_a_half_zero1(pool):
    """ZeRO-1: reduce-scatter + all-gather (2Φ·(N-1)/N); ZeRO-3: reduce-scatter + all-gather before
    forward and again before backward (3Φ·(N-1)/N), the root bucket gathered once."""
    world = 4
    _, z1 = _run(pool, world, strategy="zero1", comm_algorithm="ring", bucket_mb=64.0)
    cfg3, z3 = _run(pool, world, strategy="zero3", comm_algorithm="ring")
    phi = param_count(cfg3.shape).total
    root = sum(n for n, is_root, *_ in z3[0]["buckets"] if is_root)
    expected = (3 * phi - root) / (2 * phi)
    for a, b in zip(z1, z3):
        ratio = b["sent"] / a["sent"]
        assert 1.45 < ratio <= 1.5 and abs(ratio - expected) < 0.01, (ratio, expected)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_zero3_layers_gathered_at_once_are_the_report_twins(pool, prefetch):
    from ringzero.twin.zero import gathered_twins
    from ringzero.run.result import RankResult
    cfg, results = _run(pool, 2, strategy="zero3", precision="fp32", comm_algorithm="auto", prefetch=prefetch)
    rows = gathered_twins(cfg, 2, [RankResult(rank=r["rank"], gathered=r["gathered"]) for r in results])
    assert [(t.predicted, t.measured) for t in rows] == [(1 + prefetch, 1 + prefetch)] * 2
    assert gathered_twins(TrainConfig(**BASE, strategy="zero2"), 2, []) == []


# -- activations -----------------------------------------------------------------------------------

# Known gap, not modelled: `attention="sdpa"` with dropout > 0 in bf16 (recompute "none"). On CPU
# torch falls back from the fused kernel to its math path when dropout is on; `predict` models that
# fallback as storing the s x s weights and mask in the activations' dtype, which matches fp32, but in
# bf16 the math path keeps further fp32/bf16 copies of the s x s tensors (measured +35 % for nano at
# s = 64, b = 2). With selective or full recomputation the attention core is recomputed, so the gap
# does not show there; those cases are tested.
KNOWN_GAPS = {("none", "sdpa", 0.1, "bf16")}
ACT_CASES = [c for c in itertools.product(("none", "selective", "full"), ("eager", "sdpa"), (0.0, 0.1),
                                          ("fp32", "bf16")) if c not in KNOWN_GAPS]


def _activations(group, cases):
    out = []
    for recompute, attention, dropout, precision in cases:
        cfg = TrainConfig(model="nano", seq=64, micro_batch=2, steps=2, max_bytes=65536, eval_batches=1,
                          strategy="single", recompute=recompute, attention=attention, dropout=dropout,
                          precision=precision)
        out.append((train_rank(cfg, group=group, calibrate=False).activations, predict.activations(cfg)))
    return out


@pytest.mark.timeout(180)
def test_activations_within_ten_percent(pool):
    assert len(ACT_CASES) == 23
    results = pool.run(_activations, ACT_CASES, world=1)[0]
    bad = [f"{case}: measured {m} predicted {p:.0f} ({(m - p) / p:+.1%})"
           for case, (m, p) in zip(ACT_CASES, results) if abs(m - p) > 0.1 * p]
    assert not bad, bad


@pytest.mark.timeout(60)
def test_train_rank_alone_without_process_group():
    """`train_rank`'s contract: with no process group it runs alone (world 1). Runs in the test
    process, where torch.distributed is not initialised."""
    assert not dist.is_initialized()
    cfg = TrainConfig(**{**BASE, "strategy": "single"})
    r = train_rank(cfg, calibrate=False)
    assert len(r.losses) == cfg.training.steps and r.activations > 0
