"""Inputs that answer fast and right: a data file read only up to --max-bytes, a FIFO or a device
refused by name, `ringzero plan` on absurd counts answering or refusing in one line, the pre-rank
checks of `ringzero train` importing no torch, and one default dropout for the Python API and the
command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero import cli
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.train import data

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def _peak_bytes(fn) -> int:
    """Peak bytes Python allocated while `fn` ran (tracemalloc: no timing)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:            # a hole: `size` bytes on paper, none on disk
        f.truncate(size)
    return path


# 1. --data: at most --max-bytes read; only regular files.

def test_a_file_far_larger_than_max_bytes_costs_max_bytes(tmp_path):
    big = _sparse(tmp_path / "big.txt", 256 * MiB)
    out = []
    peak = _peak_bytes(lambda: out.append(data.corpus_bytes(str(big), MiB)))
    assert len(out[0]) == MiB
    assert peak < 4 * MiB, f"read {peak} bytes for a corpus of {MiB}"


def test_a_folder_is_read_up_to_max_bytes_in_path_order(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x" * 1000)
    _sparse(tmp_path / "b.txt", 256 * MiB)
    (tmp_path / "c.txt").write_bytes(b"never read")
    out = []
    peak = _peak_bytes(lambda: out.append(data.corpus_bytes(str(tmp_path), MiB)))
    assert len(out[0]) == MiB and out[0][:1000] == b"x" * 1000 and set(out[0][1000:]) == {0}
    assert peak < 4 * MiB
    assert bytes(data.corpus_bytes(str(tmp_path), 600)) == b"x" * 600


def test_a_fifo_is_named_and_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"is a named pipe \(FIFO\); give a regular text file or a folder of them"):
        data.corpus_bytes(str(fifo))
    # in a folder a FIFO is skipped, never opened (opening one blocks until a writer comes)
    (tmp_path / "text.txt").write_bytes(b"hello world")
    assert bytes(data.corpus_bytes(str(tmp_path))) == b"hello world"


def test_a_device_is_named_and_refused():
    with pytest.raises(ValueError, match="'/dev/zero' is a character device; give a regular text file"):
        data.corpus_bytes("/dev/zero")


def _ringzero(args: list[str], timeout: float = 60.0, check_torch: bool = False) -> subprocess.CompletedProcess:
    """`ringzero ARGS` in a fresh interpreter; with `check_torch` it prints TORCH=<imported?> at exit."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('TORCH=' + str('torch' in sys.modules), file=sys.stderr))\n"
            if check_torch else "import sys\n") + "from ringzero import cli\nsys.exit(cli.main(sys.argv[1:]))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("TORCH=")]
    assert len(lines) == 1 and lines[0].startswith("ringzero: error:"), err
    return lines[0]


def test_train_refuses_a_fifo_before_any_rank_and_without_torch(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    r = _ringzero(["train", "--data", str(fifo), "--quiet"], timeout=30, check_torch=True)
    assert r.returncode == 2, r.stderr
    assert "named pipe (FIFO)" in _one_error_line(r.stderr)
    assert "TORCH=False" in r.stderr


# 2. `ringzero plan` on extreme counts: an answer or one line, never a hang.

@settings(max_examples=300, deadline=None)
@given(st.integers(1, 80), st.data())
def test_the_even_partition_is_the_programmes_cut(layers, draw):
    from ringzero.plan.pipeline.layout import even_partition
    chunks = draw.draw(st.integers(1, layers))
    cost, last = draw.draw(st.integers(1, 50)), draw.draw(st.integers(0, 400))
    assert even_partition(layers, chunks, float(cost), float(last)) == \
        pipeline.partition([float(cost)] * layers, chunks, last=float(last))


def test_the_deepest_model_on_a_billion_gpus_is_refused_in_one_line():
    r = _ringzero(["plan", "--layers", "10000", "--hidden", "65536", "--heads", "512", "--vocab", "50257",
                   "--seq", "2048", "--gpus", "1000000000"], timeout=20)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    line = _one_error_line(r.stderr)
    assert "--layers 10000" in line and "at most 1,024" in line


@pytest.mark.timeout(60)
def test_the_python_api_refuses_past_the_limits_and_answers_at_them():
    """recommend and search refuse 10,000 layers (they never answered); at the limits (1,024 layers,
    10⁹ GPUs) the recommendation's pipeline cut is cheap."""
    from ringzero.plan import Training, hardware, recommend, search
    from ringzero.plan.model.shapes import ModelShape
    hw = hardware("a100-80gb")
    deep = ModelShape(layers=10000, hidden=65536, heads=512, vocab=50257, seq=2048)
    for fn in (recommend, search):
        with pytest.raises(ValueError, match="10,000 layers is more than the planner takes: at most 1,024"):
            fn(deep, Training(), hw, 10**9)
    m = ModelShape(layers=1024, hidden=65536, heads=512, vocab=50257, seq=2048)
    assert recommend(m, Training(), hw, 10**9).steps


EXTREME = st.sampled_from([1, 2, 3, 7, 8, 12, 1000, 1024, 1025, 10**4, 10**6, 10**9, 10**9 + 1, 10**21])


@settings(max_examples=8, deadline=None)
@given(layers=EXTREME, gpus=EXTREME, pp=st.sampled_from([1, 2, 8]), batch=st.sampled_from([None, 10**6, 10**9]),
       search=st.booleans())
def test_extreme_plans_answer_or_refuse_in_one_line(layers, gpus, pp, batch, search):
    args = ["plan", "--model", "gpt2", "--layers", str(layers), "--gpus", str(gpus * pp), "--pp", str(pp),
            "--gpus-per-node", "1", "--json"] + (["--global-batch", str(batch)] if batch else []) \
        + (["--search"] if search else [])
    r = _ringzero(args, timeout=30)
    if r.returncode == 0:
        json.loads(r.stdout)
    else:
        assert r.returncode == 2 and r.stdout == "", r.stderr
        _one_error_line(r.stderr)


# 3. The checks before any rank import no torch.

def test_a_bad_train_config_imports_no_torch():
    code = ("import sys\nfrom ringzero.run.config import FieldError, TrainConfig\n"
            "try:\n    TrainConfig(steps=0)\nexcept FieldError as e:\n    print(e.field)\n"
            "TrainConfig(max_nonfinite=2, inject_nonfinite=(0, 1), steps=3)\n"
            "print('torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.stdout.split() == ["steps", "False"], r.stdout + r.stderr


@pytest.mark.parametrize("argv, words", [(["--steps", "0"], "steps must be >= 1"),
                                         (["--max-nonfinite", "0"], "max_nonfinite must be an integer >= 1"),
                                         (["--data", "/dev/zero"], "character device")])
def test_train_refuses_bad_input_without_importing_torch(argv, words):
    r = _ringzero(["train", *argv, "--quiet"], check_torch=True)
    assert r.returncode == 2, r.stderr
    assert words in _one_error_line(r.stderr)
    assert "TORCH=False" in r.stderr


# 5. One default dropout: the docs' snippet (docs/planning.md) and `ringzero plan` agree.

def _docs_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "planning.md").read_text(), flags=re.S)
    return next(b for b in blocks if "estimate(model(" in b)


def test_the_docs_snippet_is_what_ringzero_plan_prints(capsys):
    snippet = _docs_snippet()
    assert 'model("llama-2-7b")' in snippet and "Parallel(dp=8, zero=3)" in snippet, snippet
    scope: dict = {}
    exec(snippet.replace("e.memory.total, e.fits", "_ = e.memory.total, e.fits"), scope)   # noqa: S102
    e = scope["e"]
    code = cli.main(["plan", "--model", "llama-2-7b", "--gpus", "8", "--gpu", "a100-80gb", "--zero", "3",
                     "--micro-batch", "1", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (e.memory.total, e.fits, e.comm_bytes("zero")) == (plan["memory"]["total"], plan["fits"],
                                                               plan["comm"]["zero"])
    assert e.fits and e.time.step == pytest.approx(plan["time"]["step"], rel=1e-12)


@pytest.mark.parametrize("name, dropout", [("llama-2-7b", False), ("gpt2", True), ("nano", False)])
def test_training_and_the_cli_take_the_presets_recipe(name, dropout, capsys):
    from ringzero.plan import Training, model
    assert Training().dropout_for(model(name)) is dropout
    assert cli.main(["plan", "--model", name, "--gpus", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["training"]["dropout"] is dropout
