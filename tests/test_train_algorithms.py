"""Every `--comm-algorithm` that `ringzero train` offers trains and is predicted, for DP and ZeRO.

The offered values are the all-reduce algorithms of `comm.registry` plus "auto" and "torch". Each
runs one step on 2 ranks of the session pool under DP and ZeRO-3 (which runs reduce-scatter and
all-gather, mapped from the all-reduce name by `ShardingConfig.algorithm_for`), and the test process
then computes the whole report (`report.twins`: bytes and seconds of every collective).
"""

from __future__ import annotations

import math

import pytest

from ringzero.comm import registry
from ringzero.twin import predict
from ringzero.twin import report
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank

OFFERED = registry.SPECIAL + registry.algorithms("all_reduce")
STRATEGIES = ("dp", "zero3")
BASE = dict(model="nano", seq=16, micro_batch=1, steps=1, max_bytes=65536, eval_every=1000, eval_batches=1)


def _train(group, configs):
    return [train_rank(cfg, group=group) for cfg in configs]


def test_offered_algorithms_are_the_registry_names():
    assert set(OFFERED) == {"auto", "torch", "naive", "ring", "tree", "butterfly", "rabenseifner",
                            "hierarchical", "hierarchical_2d"}
    for name in OFFERED:
        TrainConfig(comm_algorithm=name)
    with pytest.raises(ValueError, match="comm_algorithm"):
        TrainConfig(comm_algorithm="recursive_doubling")     # an all-gather name, not an all-reduce one


@pytest.mark.timeout(240)
@pytest.mark.parametrize("algorithm", OFFERED)
def test_every_algorithm_trains_and_is_predicted(pool, algorithm):
    configs = [TrainConfig(**BASE, strategy=s, comm_algorithm=algorithm) for s in STRATEGIES]
    per_rank = pool.run(_train, configs, world=2)
    for i, cfg in enumerate(configs):
        results = [rank_results[i] for rank_results in per_rank]
        rows = {t.name: t for t in report.twins(cfg, 2, results)}
        sent = rows["bytes sent per step"]
        assert sent.predicted > 0, (cfg.parallel.strategy, algorithm)
        if algorithm == "torch":        # the meter cannot see inside the backend's own collectives
            assert sent.measured is None and sent.error is None
        else:
            for r in results:
                assert predict.traffic(cfg, 2, r.buckets, r.rank)["bytes_sent"] == sum(
                    op["bytes_sent"] for op in r.traffic["ops"].values()), (cfg.parallel.strategy, algorithm)
        for comm in (rows["exposed communication per step"].predicted,
                     predict.comm_seconds(cfg, 2, results[0].buckets)):      # the α-β-γ model's
            assert math.isfinite(comm) and comm > 0, (cfg.parallel.strategy, algorithm)
