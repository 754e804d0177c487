"""`ringzero train` bad input, checked the same way by every test file that has some: one line on
stderr, exit code 2, the report not written and nothing else either; and the helpers those files
share (no rank may start; is a process alive)."""

import os

from ringzero import cli


def train_fails(capsys, tmp_path, argv, *words):
    """`ringzero train ARGV --json-report R` exits 2 with one stderr line naming `words`; R not written."""
    report = tmp_path / "report.json"
    before = sorted(p.name for p in tmp_path.iterdir())
    code = cli.main(["train", *argv, "--json-report", str(report), "--quiet"])
    out = capsys.readouterr()
    assert code == 2, out
    line = out.err.strip()
    assert line.startswith("ringzero: error:") and "\n" not in line, out.err
    for w in words:
        assert w in line, (w, line)
    assert not report.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"
    return line


def _no_ranks(*args, **kwargs):
    raise AssertionError("a rank was about to start: the input passed every check")


def forbid_ranks(monkeypatch) -> None:
    """Make starting any rank fail the test: what follows runs the checks only."""
    monkeypatch.setattr("ringzero.launch.run", _no_ranks)
    monkeypatch.setattr("ringzero.launch.spawn", _no_ranks)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def tree(root) -> list[str]:
    """Every file and folder under `root`, relative, sorted."""
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def refused(capsys, root, argv: list[str], *expected: str) -> str:
    """cli.main(argv) is bad input: exit 2, one line naming each of `expected`, no traceback, nothing
    new under `root`; returns the line without its "ringzero: error: " prefix."""
    before = tree(root)
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 2, (code, out.err)
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ringzero: error: "), out.err
    for e in expected:
        assert e in lines[0], (e, lines[0])
    assert "Traceback" not in out.out + out.err
    assert tree(root) == before, "something was written"
    return lines[0].removeprefix("ringzero: error: ")
