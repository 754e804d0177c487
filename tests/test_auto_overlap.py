"""The ring's pipelined overlap in the α-β-γ model behind algorithm="auto" (pure: no ranks, no timing)."""

import json

import numpy as np
import pytest

from ringzero.comm import cost, registry, select
from ringzero.plan.comm.chunks import SEGMENT_BYTES
from ringzero.plan.comm.volume import PIPELINED, call_for, volume, volumes
from ringzero.plan.comm.volume import overlapped_bytes as ob
from ringzero.plan.comm.network import FEATURES, AlphaBetaGamma, predict

KiB, MiB = 1 << 10, 1 << 20
# A plain network on which the ring's only edge is its pipeline: per round 50 µs, 1 GB/s, 4 GB/s.
NET = AlphaBetaGamma(alpha=50e-6, beta=1e-9, gamma=0.25e-9, per_message=0.0, per_call=0.0,
                     host_message=0.0, host_beta=0.0, host_gamma=0.0)
FREE = {"beta": 0.0, "host_beta": 0.0}
"""Overlapped bytes cost nothing: the pipeline hides them completely."""


def _ob(collective, algorithm, n, nbytes, rank=0):
    call = call_for(collective, algorithm, n, nbytes // 4, 4)
    return ob(call, volume(call, rank))


def test_no_overlap_without_a_pipeline():
    # chunks of one segment (<= 1 MiB) have nothing behind them; the other algorithms never pipeline
    assert SEGMENT_BYTES == MiB
    assert _ob("all_reduce", "ring", 4, 4 * MiB) == 0
    assert _ob("all_reduce", "ring", 4, KiB) == 0
    for alg in registry.algorithms("all_reduce"):
        if ("all_reduce", alg) not in PIPELINED:
            assert _ob("all_reduce", alg, 4, 64 * MiB) == 0, alg


@pytest.mark.parametrize("collective, n, nbytes, phases", [
    ("all_reduce", 4, 8 * MiB, 2), ("all_reduce", 4, 64 * MiB, 2), ("all_reduce", 3, 12 * MiB, 2),
    ("reduce_scatter", 4, 16 * MiB, 1), ("all_gather", 2, 32 * MiB, 1)])
def test_overlapped_bytes_is_what_the_pipelined_chain_hides(collective, n, nbytes, phases):
    """Each phase of n-1 steps of m-segment chunks has n-1+m-1 segments on its critical path
    instead of (n-1)·m: the rest of the rank's bytes are overlapped."""
    chunk = nbytes // n
    m = chunk // MiB
    moved = phases * (n - 1) * chunk
    assert _ob(collective, "ring", n, nbytes) == moved - phases * (n - 1 + m - 1) * MiB
    assert _ob(collective, "ring", n, nbytes) == (phases * (n - 1) * (m - 1) - phases * (m - 1)) * MiB


def test_credit_is_the_overlapped_bytes_at_beta_less_their_own_coefficient():
    call = call_for("all_reduce", "ring", 4, 8 * MiB // 4, 4)
    ov = cost.overlapped(call, volumes(call))
    assert ov == (4 * MiB, 4 * 4 * MiB)
    assert cost.overlap_credit(NET, None, ov) == 0.0
    assert cost.overlap_credit(NET, FREE, ov) == pytest.approx(1e-9 * 4 * MiB)
    assert cost.overlap_credit(NET, {"beta": 1e-9, "host_beta": 0.0}, ov) == 0.0


def _rows(truth, overlap):
    """Synthetic all-reduce rows: `truth` less the overlap credit for the ring."""
    rows = []
    for alg in ("naive", "ring", "tree", "butterfly", "rabenseifner"):
        for n in (2, 3, 4):
            for nbytes in (KiB, 64 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB):
                count = nbytes // 4 - (nbytes // 4) % n
                call = call_for("all_reduce", alg, n, count, 4)
                t = predict(call, truth) - cost.overlap_credit(truth, overlap, cost.overlapped(call, volumes(call)))
                rows.append({"collective": "all_reduce", "algorithm": alg, "world": n, "count": count,
                             "itemsize": 4, "ranks_per_node": None, "time_us": t * 1e6})
    return rows


@pytest.fixture(scope="module")
def calibrated():
    return cost.fit(_rows(NET, FREE), per_algorithm=False, prior=None)      # exact data: a plain fit


def test_calibration_recovers_the_overlap(calibrated):
    np.testing.assert_allclose(calibrated.model.coefficients(), NET.coefficients(), rtol=1e-6, atol=1e-15)
    assert calibrated.overlap["shared"] == pytest.approx(FREE, abs=1e-15)
    assert calibrated.error["max"] < 1e-9


def test_auto_picks_the_ring_where_its_pipeline_pays_and_a_short_path_when_small(calibrated):
    assert select.best("all_reduce", 4, 8 * MiB, None, calibrated) == "ring"
    # without the overlap the ring's 2(n-1) rounds lose to Rabenseifner's 2·log2(n) at the same bytes
    assert select.best("all_reduce", 4, 8 * MiB, None, cost.Calibration(model=calibrated.model)) != "ring"
    small = select.best("all_reduce", 4, KiB, None, calibrated)
    rounds = {a: volume(call_for("all_reduce", a, 4, KiB // 4, 4), 0).rounds
              for a in select.candidates("all_reduce", 4, None)}
    assert rounds[small] == min(rounds.values()) and small != "ring"


def test_overlap_survives_the_file_and_torch_gets_none(calibrated, tmp_path, monkeypatch):
    path = cost.save(calibrated, tmp_path / "cal.json")
    assert cost.load(path) == calibrated
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(path))
    assert select.choose("all_reduce", 4, 8 * MiB, None) == "ring"
    ring = select.seconds("all_reduce", "ring", 4, 8 * MiB)
    assert select.seconds("all_reduce", "torch", 4, 8 * MiB) == pytest.approx(ring + 1e-9 * 4 * MiB)
    data = json.loads(path.read_text())
    data["overlap"] = {"shared": {"beta": -1.0, "host_beta": 0.0}}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not valid"):
        cost.load(path)


def test_a_file_without_overlap_prices_as_before(tmp_path, monkeypatch):
    path = cost.save(cost.Calibration(model=NET), tmp_path / "cal.json")
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(path))
    call = call_for("all_reduce", "ring", 4, 8 * MiB // 4, 4)
    assert select.seconds("all_reduce", "ring", 4, 8 * MiB) == predict(call, NET)
    assert len(FEATURES) == 8          # the overlap is a pair beside the model, not a ninth coefficient
