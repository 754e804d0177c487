"""One rule for every file the command line writes: checked before any work (a missing folder, a
folder given as the file, an unwritable place are one line, exit 2, nothing created anywhere), the
user's path in the message, and no temporary file left behind by a failed write."""

from __future__ import annotations

import os

import pytest

from ringzero import cli, outputs
from ringzero.errors import UsageError

TRAIN = ["train", "--nproc", "2", "--steps", "1", "--seq", "16", "--micro-batch", "1", "--max-bytes", "65536",
         "--quiet"]
BENCH_COMM = ["bench", "comm", "--nproc", "2", "--collective", "all_reduce", "--sizes", "4KiB,64KiB", "--iters", "1"]
BENCH_TRAIN = ["bench", "train", "--nproc", "2", "--suites", "dp", "--steps", "4"]


def _bad_paths(tmp_path):
    (tmp_path / "adir").mkdir()
    return {"folder": str(tmp_path / "adir"), "missing folder": str(tmp_path / "no" / "such" / "r.json"),
            "sysfs": "/sys/ringzero-test.json", "procfs": "/proc/ringzero-test.json"}


CASES = [(TRAIN, "--json-report"), (BENCH_COMM, "--plot"), (BENCH_COMM + ["--calibrate"], "--out"),
         (BENCH_TRAIN, "--json")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, flag", CASES, ids=["train-report", "comm-plot", "comm-out", "train-json"])
@pytest.mark.parametrize("kind", ["folder", "missing folder", "sysfs", "procfs"])
def test_a_bad_output_path_is_one_line_before_any_work(capsys, tmp_path, argv, flag, kind):
    path = _bad_paths(tmp_path)[kind]
    before = sorted(os.listdir(tmp_path))
    code = cli.main([*argv, flag, path])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("ringzero: error:") and "\n" not in err, err
    assert flag in err and repr(path) in err, err           # the user's path, not a temporary file
    assert sorted(os.listdir(tmp_path)) == before
    assert not os.path.exists(path) or os.path.isdir(path)


def test_out_without_calibrate_is_refused(capsys, tmp_path):
    assert cli.main([*BENCH_COMM, "--out", str(tmp_path / "c.json")]) == 2
    assert "--calibrate" in capsys.readouterr().err


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path):
    target = tmp_path / "r.json"

    def writer(f):
        f.write("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError, match=f"cannot write {str(target)!r}: No space left on device"):
        outputs.write_with(target, writer)
    assert os.listdir(tmp_path) == []


def test_a_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    outputs.write_text(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["r.json"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


def test_check_names_the_flag_and_the_reason(tmp_path):
    with pytest.raises(UsageError, match=r"--plot '.*missing/x.png': folder '.*missing' does not exist"):
        outputs.check(tmp_path / "missing" / "x.png", "--plot")
    assert outputs.check(tmp_path / "x.png", "--plot") == str(tmp_path / "x.png")
