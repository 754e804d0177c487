"""Byte twins by kind: for every strategy under every feature the configuration accepts (offload,
ZeRO++, gradient compression, tensor and sequence parallelism, pipelines, precision, accumulation,
the parameter server), each rank's bytes of each kind in the measured step equal the planner's,
sent and received, and no byte goes untagged.

The features come from their own registries (the strategies, ZeRO++'s options, the compression
schemes), so a new one is run here without editing this file; a combination the configuration
refuses is left out, as the command line would refuse it before any rank starts. Kinds are a
property of each planner call (`plan.comm.kinds`): this test is what holds the engine's call sites
to the same table.
"""

from __future__ import annotations

import pytest

from ringzero.plan.comm.kinds import OTHER, PS
from ringzero.plan.comm.volume import Volume
from ringzero.plan.strategies.compression import SCHEMES
from ringzero.plan.strategies.sharding import STRATEGIES
from ringzero.plan.strategies.zeropp import OPTIONS
from ringzero.run.config import TrainConfig
from ringzero.run.fields import FieldError
from ringzero.train.rank import train_rank
from ringzero.twin import kinds as report_kinds
from ringzero.twin import predict

BASE = dict(model="nano", seq=16, micro_batch=1, steps=3, max_bytes=65536, eval_every=1000, eval_batches=1,
            layers=2)

FEATURES: dict[str, tuple[dict, int]] = {
    "plain": ({}, 2),
    "accumulation": (dict(grad_accum=2), 2),
    "bf16": (dict(precision="bf16"), 2),
    "offload-optimizer": (dict(offload_optimizer="cpu"), 2),
    "offload-params": (dict(offload_params="cpu"), 2),
    **{f"zeropp-{o}": (dict(zeropp=(o,), ranks_per_node=2), 4) for o in OPTIONS},
    "zeropp-all": (dict(zeropp=OPTIONS, ranks_per_node=2), 4),
    **{f"compress-{s}": (dict(compress=s, compress_start=1), 2) for s in SCHEMES if s != "none"},
    "tp": (dict(tp=2), 4),
    "tp-sp": (dict(tp=2, sequence_parallel=True), 4),
    "pp": (dict(pp=2, grad_accum=2), 4),
    "pp-tp": (dict(pp=2, tp=2, grad_accum=2), 4),
    # features together, as the command line takes them
    "zeropp-all+offload-params+bf16": (dict(zeropp=OPTIONS, ranks_per_node=2, offload_params="cpu",
                                            precision="bf16"), 4),
    "tp-sp+compress-fp16": (dict(tp=2, sequence_parallel=True, compress="fp16", compress_start=1), 4),
    "pp+compress-powersgd": (dict(pp=2, grad_accum=2, compress="powersgd", compress_start=1), 4),
    "pp-tp-sp+offload-optimizer": (dict(pp=2, tp=2, sequence_parallel=True, grad_accum=2,
                                        offload_optimizer="cpu"), 4),
}
"""Each feature's options and its ranks (4 where the dp group would otherwise be one rank)."""


def _accepted(strategy: str, feature: str) -> TrainConfig | None:
    options, world = FEATURES[feature]
    try:
        cfg = TrainConfig(**BASE, **options, strategy=strategy)
        cfg.placement(world)
        predict.grouped_calls(cfg, world, [])
    except (FieldError, ValueError):
        return None
    return cfg


CASES = [(s, f) for s in STRATEGIES for f in FEATURES if _accepted(s, f) is not None]


def _kinds(group, cfg: TrainConfig):
    r = train_rank(cfg, group=group, calibrate=False)
    return {"rank": r.rank, "kinds": r.kinds, "traffic": r.traffic, "buckets": r.buckets,
            "sp_elements": r.sp_elements}


class _Result:
    def __init__(self, r: dict) -> None:
        self.__dict__.update(r)


def test_the_matrix_covers_every_feature_and_strategy():
    """Every strategy runs with some feature and every feature with some strategy: a registry entry
    the configuration refuses everywhere would otherwise leave this file silently."""
    assert {s for s, _ in CASES} == set(STRATEGIES)
    assert {f for _, f in CASES} == set(FEATURES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy, feature", CASES, ids=[f"{s}-{f}" for s, f in CASES])
def test_every_kinds_bytes_are_predicted_exactly(pool, strategy, feature):
    cfg, world = _accepted(strategy, feature), FEATURES[feature][1]
    results = pool.run(_kinds, cfg, world=world)
    for r in results:
        got = {k: Volume(**v) for k, v in r["kinds"].items() if v["bytes_sent"] or v["bytes_recv"]}
        assert OTHER not in got, (r["rank"], got)
        metered = sum((Volume(**op) for op in r["traffic"]["ops"].values()), Volume())
        assert sum(got.values(), Volume()) == metered
        want = {k: v for k, v in predict.traffic_by_kind(cfg, world, r["buckets"], r["rank"], r["sp_elements"]).items()
                if v.bytes_sent or v.bytes_recv}
        assert {k: (v.bytes_sent, v.bytes_recv) for k, v in got.items()} == \
            {k: (v.bytes_sent, v.bytes_recv) for k, v in want.items()}, r["rank"]
    rows = report_kinds.twins(cfg, world, [_Result(r) for r in results])
    assert all(t.error == 0 for t in rows), rows


def _ps_kinds(group, cfg: TrainConfig):
    r = train_rank(cfg, group=group, calibrate=False)
    return r.role, r.kinds, r.traffic


@pytest.mark.timeout(120)
def test_a_parameter_servers_bytes_are_all_pushes_and_pulls(pool):
    """A parameter server's workers move nothing but pushes and pulls in their measured step: every
    byte the meter counted is of kind "ps"."""
    cfg = TrainConfig(**BASE, strategy="ps", servers=1)
    workers = [(kinds, traffic) for role, kinds, traffic in pool.run(_ps_kinds, cfg, world=3) if role == "worker"]
    assert len(workers) == 2
    for kinds, traffic in workers:
        metered = sum((Volume(**op) for op in traffic["ops"].values()), Volume())
        assert set(kinds) == {PS} and Volume(**kinds[PS]) == metered and metered.bytes_sent > 0, kinds
