"""Bad transport input: one line, exit 2, before any rank starts; and the preflight's sizing of /dev/shm."""

from __future__ import annotations

import pytest

from ringzero import cli
from ringzero.comm import configure
from ringzero.comm.config import CommConfig
from ringzero.comm.transport import layout, preflight, segment
from cli_errors import forbid_ranks, train_fails


def test_an_unknown_transport_is_refused_everywhere(capsys, tmp_path, monkeypatch):
    forbid_ranks(monkeypatch)
    train_fails(capsys, tmp_path, ["--nproc", "2", "--transport", "tcp"], "--transport", "auto", "shm", "gloo")
    code = cli.main(["bench", "comm", "--nproc", "2", "--transport", "tcp"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--transport" in err and "shm" in err
    with pytest.raises(ValueError, match="transport must be one of auto, shm, gloo, got 'tcp'"):
        CommConfig(transport="tcp")
    with pytest.raises(ValueError, match="transport must be one of"), configure(transport="udp"):
        pass


def test_shm_across_hosts_under_torchrun_is_refused_before_ranks_start(capsys, tmp_path, monkeypatch):
    forbid_ranks(monkeypatch)
    monkeypatch.setattr("ringzero.torchrun_job.join", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    for k, v in {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    train_fails(capsys, tmp_path, ["--transport", "shm", "--strategy", "dp"], "--transport shm", "16 ranks",
                "8 per host", "auto")


def test_dev_shm_too_small_for_the_channels(monkeypatch):
    sizes = preflight.grid_groups(8, 2, 2, 2)
    need = layout.channels_bytes(sizes)
    assert need == sum(k * (k - 1) for k in [8, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4]) * layout.segment_bytes()
    monkeypatch.setattr(segment, "free_bytes", lambda: need - 1)
    with pytest.raises(ValueError, match=rf"--transport shm needs up to {need / 2**20:,.0f} MiB in /dev/shm"):
        preflight.transport_for("shm", sizes, torchrun=False)
    chosen, note = preflight.transport_for("auto", sizes, torchrun=False)
    assert chosen == "gloo" and "messages take gloo" in note
    monkeypatch.setattr(segment, "free_bytes", lambda: need)
    assert preflight.transport_for("shm", sizes, torchrun=False) == ("shm", None)
    assert preflight.transport_for("gloo", sizes, torchrun=False) == ("gloo", None)


def test_train_with_too_small_dev_shm_is_one_line(capsys, tmp_path, monkeypatch):
    forbid_ranks(monkeypatch)
    monkeypatch.setattr(segment, "free_bytes", lambda: 1 << 20)
    train_fails(capsys, tmp_path, ["--nproc", "4", "--transport", "shm"], "/dev/shm", "MiB", "--transport gloo")


def test_a_calibration_of_another_transport_is_refused_before_ranks_start(capsys, tmp_path, monkeypatch):
    from ringzero.comm import cost
    from ringzero.plan.comm.network import TEXTBOOK, predict
    from ringzero.plan.comm.volume import call_for
    rows = [{"collective": "all_reduce", "algorithm": "ring", "world": n, "count": c, "itemsize": 4,
             "ranks_per_node": None, "time_us": predict(call_for("all_reduce", "ring", n, c, 4), TEXTBOOK) * 1e6}
            for n in (2, 3, 4) for c in (256, 4096, 1 << 16, 1 << 20)]
    path = cost.save(cost.fit(rows, per_algorithm=False, transport="gloo"), tmp_path / "cal.json")
    monkeypatch.setenv("RINGZERO_CALIBRATION", str(path))
    forbid_ranks(monkeypatch)
    train_fails(capsys, tmp_path, ["--nproc", "2", "--transport", "shm"], "cal.json", "made with transport gloo",
                "uses transport shm", "--calibrate --transport shm")
