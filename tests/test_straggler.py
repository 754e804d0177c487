"""An injected straggler in an all-reduce run: the others wait for it inside the step's collectives
as `twin.wait` predicts (the slowest compute minus their own), and nobody waits on it
longer than that; the straggler itself waits for nobody."""

from __future__ import annotations

import pytest

from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank
from ringzero.twin.wait import render, twins, waits

BASE = dict(model="nano", seq=32, micro_batch=2, eval_every=1000, eval_batches=1, max_bytes=1 << 16, steps=6)


def _train(group, cfg):
    return train_rank(cfg, group=group, calibrate=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["dp", "zero2"])
def test_ranks_wait_for_the_straggler_as_predicted(pool, strategy):
    # 6x: the wait (5 computes) dwarfs the buckets' transfers, which the waiting rank makes after it
    # (its measured wait is the wait less them; the straggler hides its own behind its backward).
    cfg = TrainConfig(strategy=strategy, straggler=(1, 6.0), **BASE)
    results = pool.run(_train, cfg, world=2)
    predicted, measured = waits(results)
    # The straggler arrives last at the step's first collectives; later ones (ZeRO's parameter
    # all-gather after each rank's own optimizer shard) may hold it a little.
    assert predicted[1] == 0.0 and measured[1] < 0.1 * measured[0], (predicted, measured)
    assert results[1].phases["straggler"] > 0 and results[0].phases["straggler"] == 0
    assert measured[0] == pytest.approx(predicted[0], rel=0.15), (predicted, measured)
    (row,) = twins(cfg, 2, results)
    assert row.predicted == predicted[0] and row.measured == measured[0]


def test_no_straggler_no_twin_and_the_table_has_every_rank():
    from rich.console import Console

    from ringzero.comm.timeline import CallRecord, Timeline
    from ringzero.train.engine import RankResult
    ph = dict(forward=0.1, backward=0.2, comm=0.05, optimizer=0.01, straggler=0.0)
    calls = [[CallRecord("all_reduce", (0, 1), 0, start=0.0, end=0.05)],
             [CallRecord("all_reduce", (0, 1), 0, start=0.04, end=0.05)]]
    logs = [Timeline(), Timeline()]
    logs[0].calls, logs[1].calls = calls
    rs = [RankResult(rank=0, phases=dict(ph), calls=[logs[0]]),
          RankResult(rank=1, phases=dict(ph, backward=0.5, comm=0.01), calls=[logs[1]])]
    cfg = TrainConfig(**BASE)
    assert twins(cfg, 2, rs) == []
    rows = render(cfg, rs, Console(file=open("/dev/null", "w")))
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[0]["predicted_waiting_s"] == pytest.approx(0.3) and rows[0]["waiting_s"] == pytest.approx(0.04)
