"""The α-β-γ model, its calibration and algorithm="auto" (pure: no ranks, no timing)."""

import json

import numpy as np
import pytest

from ringzero.comm import cost, registry, select
from ringzero.comm.config import configure
from ringzero.plan.comm.algorithms import NODE_AWARE, fits
from ringzero.plan.comm.volume import call_for
from ringzero.plan.comm import network
from ringzero.plan.comm.network import DEFAULT, FEATURES, TEXTBOOK, AlphaBetaGamma, predict

KiB, MiB = 1 << 10, 1 << 20


def _model(**coefs) -> AlphaBetaGamma:
    """A model with only the given coefficients (the rest 0, not the machine's defaults)."""
    return AlphaBetaGamma.from_coefficients([coefs.get(k, 0.0) for k in FEATURES])


ALPHA_BOUND = _model(alpha=1e-3, beta=1e-9, gamma=1e-10)


@pytest.fixture
def no_calibration(tmp_path, monkeypatch):
    """`auto` without a calibration file, whatever the machine has in ~/.cache."""
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(tmp_path / "absent.json"))
    return tmp_path


def _t(collective, algorithm, n, nbytes, model=DEFAULT, rpn=None):
    return predict(call_for(collective, algorithm, n, nbytes // 4, 4, ranks_per_node=rpn), model)


def _synthetic_rows(model, collectives=("all_reduce", "broadcast", "reduce_scatter")):
    rows = []
    for collective in collectives:
        for alg in registry.algorithms(collective):
            for n in (2, 3, 4, 6, 8):
                for nbytes in (KiB, 48 * KiB, MiB, 16 * MiB + 12):
                    rpn = 2 if alg in NODE_AWARE else None
                    if not fits(alg, n, rpn):
                        continue
                    count = nbytes // 4 - (nbytes // 4) % n
                    t = predict(call_for(collective, alg, n, count, 4, ranks_per_node=rpn), model)
                    rows.append({"collective": collective, "algorithm": alg, "world": n, "count": count,
                                 "itemsize": 4, "ranks_per_node": rpn, "time_us": t * 1e6})
    return rows


def test_predict_is_monotone_in_size():
    sizes = [0, 4, KiB, 4 * KiB + 4, 64 * KiB, MiB, 3 * MiB + 4, 64 * MiB]
    for collective in ("all_reduce", "broadcast", "reduce"):
        for alg in registry.algorithms(collective):
            for n in [n for n in (2, 5, 8) if fits(alg, n, 2)]:
                times = [_t(collective, alg, n, s, rpn=2) for s in sizes]
                assert times == sorted(times), (collective, alg, n, times)
                assert times[0] == 0.0 and times[-1] > 0


def test_alpha_bound_small_messages_avoid_the_ring():
    """On 8 ranks with a large α, log-round algorithms beat ring's 2(n-1) rounds at 1 KiB."""
    ring = _t("all_reduce", "ring", 8, KiB, ALPHA_BOUND)
    for alg in ("tree", "butterfly", "rabenseifner"):
        if alg in registry.algorithms("all_reduce"):
            assert _t("all_reduce", alg, 8, KiB, ALPHA_BOUND) < ring, alg
    cal = cost.Calibration(model=ALPHA_BOUND)
    assert select.best("all_reduce", 8, KiB, None, cal) != "ring"


def test_bandwidth_bound_large_messages_pick_ring_or_rabenseifner():
    cal = cost.Calibration(model=ALPHA_BOUND)
    assert select.best("all_reduce", 8, 64 * MiB, None, cal) in ("ring", "rabenseifner")
    assert select.best("all_reduce", 8, 64 * MiB, None, None) in ("ring", "rabenseifner")


def test_fit_recovers_known_coefficients_exactly():
    true = AlphaBetaGamma(alpha=42e-6, beta=0.7e-9, gamma=0.2e-9, per_message=3e-6, per_call=15e-6,
                          host_message=90e-6, host_beta=0.05e-9, host_gamma=0.1e-9)
    cal = cost.fit(_synthetic_rows(true), prior=None)           # a plain fit: no pull toward the defaults
    np.testing.assert_allclose(cal.model.coefficients(), true.coefficients(), rtol=1e-6, atol=1e-15)
    assert cal.error["max"] < 1e-9 and cal.error["shared"]["max"] < 1e-9
    got = cost.fit(_synthetic_rows(TEXTBOOK, ("all_reduce",)), per_algorithm=False, prior=None).model
    np.testing.assert_allclose(got.coefficients(), TEXTBOOK.coefficients(), rtol=1e-6, atol=1e-15)


def test_nnls_clips_negative_coefficients():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0, 0.0])  # unconstrained slope would be -1
    x = cost.nnls(a, b)
    assert x[1] == 0.0 and x[0] == pytest.approx(1.5)
    with pytest.raises(ValueError, match=">= 0"):
        AlphaBetaGamma(alpha=-1.0)


def test_fit_needs_enough_rows():
    with pytest.raises(ValueError, match="at least"):
        cost.fit([{"collective": "all_reduce", "algorithm": "torch", "world": 2, "count": 4, "time_us": 1.0}])


def test_select_without_calibration_is_valid_for_every_collective(no_calibration):
    assert select.calibration() is None
    for collective in registry.COLLECTIVES:
        for n in (1, 2, 3, 8, 16):
            for nbytes in (0, 1, KiB, MiB, 64 * MiB):
                for rpn in (None, 2):
                    alg = select.choose(collective, n, nbytes, rpn)
                    assert alg in registry.algorithms(collective)
                    assert alg in registry.algorithms(collective)
                    assert alg == select.choose(collective, n, nbytes, rpn)  # deterministic


def test_hierarchical_only_across_nodes():
    assert "hierarchical" not in select.candidates("all_reduce", 4, 4)
    assert "hierarchical" not in select.candidates("all_reduce", 4, None)
    if "hierarchical" in registry.algorithms("all_reduce"):
        assert "hierarchical" in select.candidates("all_reduce", 4, 2)
        fast_hier = cost.Calibration(model=DEFAULT, per_algorithm={
            "all_reduce/hierarchical": _model(alpha=1e-9, beta=1e-15)})
        assert select.best("all_reduce", 8, MiB, 2, fast_hier) == "hierarchical"
        assert select.best("all_reduce", 8, MiB, 8, fast_hier) != "hierarchical"


def test_calibration_file_round_trip_and_reload(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    slow_ring = cost.Calibration(model=ALPHA_BOUND, per_algorithm={
        "all_reduce/ring": _model(alpha=1.0, beta=1.0, gamma=1.0)})
    assert cost.save(slow_ring, path) == path
    assert cost.load(path) == slow_ring
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(path))
    assert select.choose("all_reduce", 4, 64 * MiB, None) != "ring"
    only_ring = {f"all_reduce/{a}": _model(alpha=1.0) for a in registry.algorithms("all_reduce")}
    only_ring["all_reduce/ring"] = _model(beta=1e-12)
    cost.save(cost.Calibration(model=ALPHA_BOUND, per_algorithm=only_ring), path)
    assert select.choose("all_reduce", 4, 64 * MiB, None) == "ring"  # the new file is read


def test_calibration_path_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("RINGZERO_CALIBRATION", raising=False)
    assert str(cost.calibration_path()).endswith(".cache/ringzero/calibration.json")
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(tmp_path / "env.json"))
    assert cost.calibration_path() == tmp_path / "env.json"
    with configure(calibration=str(tmp_path / "cfg.json")):
        assert cost.calibration_path() == tmp_path / "cfg.json"
        assert cost.calibration_path(tmp_path / "arg.json") == tmp_path / "arg.json"


def test_invalid_calibration_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 999}))
    with pytest.raises(ValueError, match="not valid"):
        cost.load(bad)
    assert cost.load(tmp_path / "missing.json") is None


def test_seconds_prices_any_algorithm_and_torch(tmp_path, monkeypatch):
    """`select.seconds` prices what ran, candidate or not: hierarchical on one node (its node-local
    tree), and "torch" as the ring's traffic, with the calibration's "torch" model when it has one."""
    path = tmp_path / "cal.json"
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(path))
    assert "hierarchical" not in select.candidates("all_reduce", 4, None)
    assert select.seconds("all_reduce", "hierarchical", 4, MiB) == _t("all_reduce", "tree", 4, MiB)
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        assert select.seconds(collective, "torch", 4, MiB) == _t(collective, "ring", 4, MiB)
    ring, torch_model = _model(alpha=1e-3), _model(beta=1e-6)
    cost.save(cost.Calibration(model=ALPHA_BOUND, per_algorithm={"all_reduce/ring": ring}), path)
    assert select.seconds("all_reduce", "torch", 4, MiB) == _t("all_reduce", "ring", 4, MiB, ring)
    cost.save(cost.Calibration(model=ALPHA_BOUND, per_algorithm={"all_reduce/ring": ring,
                                                                 "all_reduce/torch": torch_model}), path)
    assert select.seconds("all_reduce", "torch", 4, MiB) == _t("all_reduce", "ring", 4, MiB, torch_model)
    with pytest.raises(ValueError, match="backend's own broadcast"):
        select.seconds("broadcast", "torch", 4, MiB)


def test_calibrating_from_one_message_size_is_refused():
    """One size: α and β are collinear and the fit would put β = 0 (see `cost.check_sizes`)."""
    rows = [r for r in _synthetic_rows(ALPHA_BOUND) if r["count"] * 4 in range(MiB - 64, MiB + 1)]
    assert len(rows) >= len(FEATURES)
    with pytest.raises(ValueError, match=r"at least 2x apart .* got 1048560B to 1MiB") as err:
        cost.fit(rows)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="got 1KiB to 1536B"):
        cost.check_sizes([1024, 1536])
    with pytest.raises(ValueError, match="got 1MiB;"):
        cost.check_sizes([MiB])
    cost.check_sizes([KiB, 2 * KiB])


def test_a_calibration_of_another_transport_or_host_is_refused_in_one_line(tmp_path, monkeypatch):
    rows = _synthetic_rows(TEXTBOOK, ("all_reduce",))
    path = cost.save(cost.fit(rows, per_algorithm=False, transport="shm"), tmp_path / "cal.json")
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(path))
    assert select.calibration("shm").meta["transport"] == "shm"
    with pytest.raises(ValueError, match=r"made with transport shm on host .*; this run uses transport gloo"):
        select.calibration("gloo")
    data = json.loads(path.read_text())
    data["meta"]["host"] = "elsewhere"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="on host elsewhere; this run uses transport shm on host"):
        select.calibration("shm")


def test_each_transport_has_its_own_default_file_and_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("RINGZERO_CALIBRATION", raising=False)
    assert str(cost.calibration_path(transport="shm")).endswith(".cache/ringzero/calibration-shm.json")
    assert network.DEFAULTS["shm"].per_message < network.DEFAULTS["gloo"].host_message / 10
    # TEXTBOOK has no per-call, per-message or host cost: a plain fit finds those zeros, the default
    # prior keeps every coefficient within BOUND of the transport's defaults (it never collapses to 0)
    rows = _synthetic_rows(TEXTBOOK, ("all_reduce",))
    plain, pulled = (cost.fit(rows, per_algorithm=False, prior=p, transport="shm").model for p in (None, "defaults"))
    assert any(v == 0 for v in plain.coefficients())
    for v, d in zip(pulled.coefficients(), network.DEFAULTS["shm"].coefficients()):
        assert d / cost.BOUND <= v <= d * cost.BOUND


def test_the_correction_makes_a_measured_cell_price_as_measured():
    rows = _synthetic_rows(TEXTBOOK, ("all_reduce",))
    slow = [dict(r, time_us=r["time_us"] * (3.0 if r["algorithm"] == "ring" else 1.0)) for r in rows]
    cal = cost.fit(slow, per_algorithm=False, prior=None)
    r = next(r for r in slow if r["algorithm"] == "ring" and r["world"] == 4 and r["count"] * 4 >= MiB)
    priced = select.price("all_reduce", "ring", 4, r["count"] * 4, None, cal)
    assert priced == pytest.approx(r["time_us"] * 1e-6, rel=1e-9)
