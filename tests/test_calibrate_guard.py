"""`ringzero bench comm --calibrate` writes no fit that predicts its own measurements worse than the
built-in defaults (what algorithm="auto" uses without a file). Pure: synthetic rows, no ranks."""

import numpy as np
import pytest

from ringzero.comm import cost
from ringzero.plan.comm.volume import call_for
from ringzero.plan.comm.network import AlphaBetaGamma, predict

KiB = 1 << 10


def _rows(truth: AlphaBetaGamma, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """All-reduce rows whose times `truth` predicts, times a log-normal noise of `noise`."""
    rng, rows = np.random.default_rng(seed), []
    for alg in ("naive", "ring", "tree", "butterfly", "rabenseifner"):
        for n in (2, 3, 4):
            for nbytes in (KiB, 16 * KiB, 256 * KiB):
                count = nbytes // 4 - (nbytes // 4) % n
                t = predict(call_for("all_reduce", alg, n, count, 4), truth) * float(np.exp(noise * rng.normal()))
                rows.append({"collective": "all_reduce", "algorithm": alg, "world": n, "count": count,
                             "itemsize": 4, "ranks_per_node": None, "time_us": t * 1e6})
    return rows


def test_the_fit_records_the_defaults_error_on_the_same_rows():
    rows = _rows(AlphaBetaGamma(alpha=20e-6, beta=2e-9, per_call=50e-6, host_message=0.0), noise=0.1)
    cal = cost.fit(rows)
    errs = [abs(predict(call_for("all_reduce", r["algorithm"], r["world"], r["count"], 4), AlphaBetaGamma())
                - r["time_us"] * 1e-6) / (r["time_us"] * 1e-6) for r in rows]
    assert cal.error["defaults"]["median"] == pytest.approx(float(np.median(errs)), rel=1e-12)
    assert cal.error["defaults"]["max"] == pytest.approx(max(errs), rel=1e-12)
    assert cal.error["median"] < cal.error["defaults"]["median"]


def test_a_fit_better_than_the_defaults_is_written(tmp_path):
    cal = cost.fit(_rows(AlphaBetaGamma(alpha=20e-6, beta=2e-9, per_call=50e-6), noise=0.05))
    path = cost.save(cal, tmp_path / "cal.json")
    assert cost.load(path) == cal


def test_the_defaults_own_measurements_are_not_refused_for_rounding(tmp_path):
    """Rows the defaults predict exactly: the fit recovers them up to its last bits, a tie."""
    cal = cost.fit(_rows(AlphaBetaGamma()), per_algorithm=False)
    assert cal.error["defaults"]["median"] < 1e-12
    assert cost.save(cal, tmp_path / "cal.json").is_file()


def test_a_fit_worse_than_the_defaults_is_refused_in_one_line_and_not_written(tmp_path):
    """The 57.9 % fit of α = β = γ = 0 that `auto` once used: refused, with both errors."""
    zero = AlphaBetaGamma(alpha=0.0, beta=0.0, gamma=0.0, per_message=0.0, per_call=50e-6, host_message=0.0,
                          host_beta=0.0, host_gamma=0.0)
    cal = cost.Calibration(model=zero, error={"median": 0.579, "max": 0.9, "rows": 40,
                                              "defaults": {"median": 0.213, "max": 0.5}})
    path = tmp_path / "cal.json"
    with pytest.raises(cost.WorseThanDefaults) as err:
        cost.save(cal, path)
    line = str(err.value)
    assert "\n" not in line and "57.9%" in line and "21.3%" in line and "40 rows" in line
    assert not path.exists()


def test_a_real_fit_worse_than_the_defaults_is_refused(tmp_path, monkeypatch):
    """The fit itself, made worse than the defaults on its rows (its solver returns nothing but a
    fixed cost): `save` refuses what `fit` produced."""
    rows = _rows(AlphaBetaGamma(), noise=0.05)
    monkeypatch.setattr(cost, "nnls", lambda a, b: np.array([1e-3] + [0.0] * (a.shape[1] - 1)))
    cal = cost.fit(rows, per_algorithm=False)
    assert cal.error["median"] > cal.error["defaults"]["median"]
    with pytest.raises(cost.WorseThanDefaults, match="calibration not written"):
        cost.save(cal, tmp_path / "cal.json")
    assert not (tmp_path / "cal.json").exists()
