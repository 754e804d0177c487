"""`ringzero train` bad input, checked the same way by every test file that has some: one line on
stderr, exit code 2, the report not written and nothing else either."""

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
