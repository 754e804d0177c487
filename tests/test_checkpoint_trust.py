"""Checkpoints that never lose or mistake data: a run removes only what its own lineage wrote, a
fresh run into another run's folder is refused, and nothing loads that is not what its manifest
says (a shard of another run, a link, a changed byte, a duplicate key, a dtype that is not the
header's, a NaN); a command never overwrites its own inputs; a resume that changes the run says so."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ringzero import cli
from ringzero.checkpoint.load import Reader
from ringzero.checkpoint.manifest import CheckpointError, Entry, Manifest, Piece, TPSlice, read
from ringzero.checkpoint.slices import assemble
from ringzero.checkpoint.folders import claimed, crc32, foreign
from ringzero.checkpoint.save import write
from ringzero.checkpoint.verify import verify
from ringzero.checkpoint import preflight
from ringzero.run.config import TrainConfig
from ringzero.train.rank import train_rank
from cli_errors import forbid_ranks, refused

BASE = dict(model="nano", seq=16, eval_every=1000, eval_batches=1, max_bytes=1 << 15, warmup=2, micro_batch=2)
QUICK = ["--seq", "16", "--micro-batch", "2", "--max-bytes", "32768", "--eval-batches", "1", "--warmup", "2",
         "--quiet"]


def _train(group, cfg):
    return train_rank(cfg, group=group, calibrate=False)


@pytest.fixture(scope="module")
def runs(pool, tmp_path_factory):
    """Two runs of one model on 2 ranks that differ only in their seed: A saved at steps 3 and 6,
    B at step 3."""
    root = tmp_path_factory.mktemp("runs")
    pool.run(_train, TrainConfig(steps=6, save_every=3, save_dir=str(root / "a"), **BASE), world=2)
    pool.run(_train, TrainConfig(steps=3, seed=7, save_dir=str(root / "b"), **BASE), world=2)
    return root


def _copy(runs, tmp_path, name="a") -> str:
    shutil.copytree(runs / name, tmp_path / name, symlinks=True)
    return str(tmp_path / name)


def _cli(argv, capsys):
    code = cli.main(argv)
    return code, capsys.readouterr().err.strip()


def _listing(root: str) -> dict[str, list[str]]:
    return {d: sorted(os.listdir(os.path.join(root, d))) for d in sorted(os.listdir(root))
            if os.path.isdir(os.path.join(root, d))}


@pytest.mark.timeout(120)
def test_a_fresh_run_into_another_runs_save_dir_is_refused_and_deletes_nothing(runs, tmp_path, capsys):
    d = _copy(runs, tmp_path)
    before = _listing(d)
    code, err = _cli(["train", "--nproc", "2", "--steps", "4", "--save-every", "2", "--save-dir", d, "--seed", "7",
                      *QUICK], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "holds checkpoints of another run (step-00000003, step-00000006)" in err and "--overwrite" in err
    assert _listing(d) == before


@pytest.mark.timeout(300)
def test_overwrite_retires_the_other_runs_checkpoints_at_or_after_its_saves(pool, runs, tmp_path):
    d = _copy(runs, tmp_path)
    pool.run(_train, TrainConfig(steps=4, save_every=2, save_dir=d, seed=7, overwrite=True, **BASE), world=2)
    assert sorted(n for n in os.listdir(d) if n.startswith("step-")) == ["step-00000002", "step-00000004"]
    assert len({read(os.path.join(d, n)).run for n in ("step-00000002", "step-00000004")}) == 1


def _snap(step: int, token: str, ancestors=(), keep=None):
    from ringzero.checkpoint.save import snapshot
    meta = {"layout": {}, "config": {}, "scaler": {}, "optimizer_step": step}
    return snapshot(step, 0, 1, [], {"torch": torch.zeros(1)}, meta, token, keep, copy=False, ancestors=ancestors)


def test_a_run_retires_only_its_own_lineages_checkpoints(tmp_path):
    """Run a saved 2 and 4. Run b (fresh) saving 3 with keep 1 leaves both of a's; run c, resumed
    from a's 2, saving 3 retires a's 4 (its lineage's abandoned future) and, keeping 1, a's 2."""
    root = str(tmp_path)
    for step in (2, 4):
        write(root, _snap(step, "a"))
    write(root, _snap(3, "b", keep=1))
    assert sorted(n for n in os.listdir(root) if n.startswith("step-")) == ["step-00000002", "step-00000003",
                                                                            "step-00000004"]
    shutil.rmtree(tmp_path / "step-00000003")
    write(root, _snap(3, "c", ancestors=("a",), keep=1))
    assert sorted(n for n in os.listdir(root) if n.startswith("step-")) == ["step-00000003"]
    assert read(os.path.join(root, "step-00000003")).lineage == ["a", "c"]
    assert foreign(root, ("a", "c")) == [] and foreign(root, ("b",)) == ["step-00000003"]


def _resume(d: str, capsys, *extra):
    return _cli(["train", "--nproc", "2", "--steps", "6", "--resume", d, *QUICK, *extra], capsys)


def _refused(code, err, *words):
    assert code == 2 and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err


@pytest.mark.timeout(120)
def test_a_shard_of_another_run_with_the_same_keys_is_refused(runs, tmp_path, capsys):
    d = _copy(runs, tmp_path)
    step3 = os.path.join(d, "step-00000003")
    shutil.copy(runs / "b" / "step-00000003" / "rank-00001.safetensors", os.path.join(step3, "rank-00001.safetensors"))
    _refused(*_resume(step3, capsys), "rank-00001.safetensors", "another run")


def _flip_a_data_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        b = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.timeout(120)
def test_a_changed_byte_a_symlink_or_a_fifo_in_place_of_a_shard_is_refused(runs, tmp_path, capsys):
    d = _copy(runs, tmp_path)
    step3 = os.path.join(d, "step-00000003")
    shard = os.path.join(step3, "rank-00000.safetensors")
    _flip_a_data_byte(shard)
    _refused(*_resume(step3, capsys), "rank-00000.safetensors", "CRC-32")
    for make in (lambda p: os.symlink(runs / "a" / "step-00000003" / "rank-00000.safetensors", p), os.mkfifo):
        os.unlink(shard)
        make(shard)
        code, err = _resume(step3, capsys)
        _refused(code, err, "rank-00000.safetensors")
        assert "symbolic link" in err or "not a regular file" in err, err


def _edit_manifest(directory: str, edit) -> None:
    path = os.path.join(directory, "manifest.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(edit(text))


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace('"step": 3', '"step": 3, "step": 6'),
     ["manifest key 'step' appears more than once in one object: which value is meant cannot be told"]),
    (lambda t: t.replace('"step": 3', '"step": 7.5'), ["'step' must be an integer >= 0, got 7.5"]),
    (lambda t: t.replace('"step": 3', '"step": -5'), ["'step' must be an integer >= 0, got -5"]),
    (lambda t: json.dumps({**json.loads(t), "rng": {"0": "rank-00000.safetensors"}}), ["rank 1's RNG state is missing"]),
])
@pytest.mark.timeout(120)
def test_a_manifest_that_cannot_be_meant_is_refused(runs, tmp_path, capsys, edit, words):
    d = _copy(runs, tmp_path)
    step3 = os.path.join(d, "step-00000003")
    _edit_manifest(step3, edit)
    with pytest.raises(CheckpointError) as exc:
        read(step3)
    for w in words:
        assert w in str(exc.value)
    _refused(*_resume(step3, capsys), "manifest.json", *words)


@pytest.mark.timeout(120)
def test_a_piece_whose_dtype_is_not_its_headers_is_refused_and_consolidate_writes_nothing(runs, tmp_path, capsys):
    d = _copy(runs, tmp_path)
    step3 = os.path.join(d, "step-00000003")
    _edit_manifest(step3, lambda t: t.replace('"dtype": "float32"', '"dtype": "bfloat16"', 1))
    out = tmp_path / "model.safetensors"
    _refused(*_cli(["checkpoint", "consolidate", step3, "--out", str(out)], capsys), "is F32 x", "BF16 x")
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".model")]


def _poison(directory: str, value: float) -> str:
    """Put `value` into a weight of rank 0's shard, keeping the manifest's size and CRC-32 true, so
    that only the values are wrong; returns the tensor's key."""
    shard = os.path.join(directory, "rank-00000.safetensors")
    with safe_open(shard, framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    key = next(k for k in sorted(tensors) if k.startswith("param/"))
    tensors[key].view(-1)[0] = value
    save_file(tensors, shard, metadata=meta)
    _edit_manifest(directory, lambda t: json.dumps({**json.loads(t), "files": {
        **json.loads(t)["files"], "rank-00000.safetensors": {"size": os.path.getsize(shard), "crc32": crc32(shard)}}}))
    return key


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_in_a_weight_shard_is_refused_before_training(runs, tmp_path, capsys, value):
    d = _copy(runs, tmp_path)
    step3 = os.path.join(d, "step-00000003")
    key = _poison(step3, value)
    _refused(*_resume(step3, capsys), "rank-00000.safetensors", key, "NaN or infinite")


@pytest.mark.timeout(120)
def test_inspect_says_what_it_read_and_verify_reads_every_shard(runs, tmp_path, capsys):
    d = str(runs / "a")
    code, _ = _cli(["checkpoint", "inspect", d], capsys)
    assert code == 0
    code = cli.main(["checkpoint", "inspect", d])
    out = capsys.readouterr().out
    assert code == 0 and "read the manifest only" in out
    code = cli.main(["checkpoint", "inspect", d, "--verify"])
    out = capsys.readouterr().out
    assert code == 0 and "verified: 2 files" in out and "CRC-32 of each" in out
    bad = _copy(runs, tmp_path)
    _flip_a_data_byte(os.path.join(bad, "step-00000006", "rank-00001.safetensors"))
    assert cli.main(["checkpoint", "inspect", bad]) == 0            # the manifest alone is fine
    capsys.readouterr()
    _refused(*_cli(["checkpoint", "inspect", bad, "--verify"], capsys), "rank-00001.safetensors", "CRC-32")


@pytest.mark.timeout(120)
def test_verify_refuses_pieces_that_cover_half_a_tensor_as_loading_does(runs, tmp_path, capsys):
    d = _copy(runs, tmp_path)
    step3 = os.path.join(d, "step-00000003")
    m = read(step3)
    name, n = next((k, e.shape[0]) for k, e in sorted(m.tensors.items()) if len(e.shape) == 1)

    def doubled(text: str) -> str:          # the file's piece of n elements is now half of its tensor
        d = json.loads(text)
        d["tensors"][name]["shape"] = [2 * n]
        return json.dumps(d)

    _edit_manifest(step3, doubled)
    with pytest.raises(CheckpointError) as loading:
        Reader(step3).tensor(name)
    assert f"elements [{n}, {2 * n}) of its {2 * n} are in no piece" in str(loading.value)
    assert cli.main(["checkpoint", "inspect", step3]) == 0           # the manifest alone reads
    capsys.readouterr()
    _refused(*_cli(["checkpoint", "inspect", step3, "--verify"], capsys), "manifest.json", str(loading.value))
    _refused(*_resume(step3, capsys), "manifest.json", str(loading.value))


def _entry(*pieces) -> Entry:
    """Tensor of shape [4, 2] from pieces (flat, tp index or None, tp parts, tp dim)."""
    tps = [None if i is None else TPSlice(dim, 1, i, parts, (4 // parts, 2) if dim == 0 else (4, 2 // parts))
           for _, i, parts, dim in pieces]
    return Entry((4, 2), "float32", [Piece("rank-00000.safetensors", f"k{j}", flat, tp)
                                     for j, ((flat, *_), tp) in enumerate(zip(pieces, tps))])


@pytest.mark.parametrize("pieces, words", [
    ([((0, 4), None, 1, 0), ((5, 8), None, 1, 0)], "elements [4, 5) of its 8 are in no piece"),
    ([((0, 4), 0, 2, 0), ((0, 2), 1, 2, 0)], "elements [2, 4) of its tensor-parallel slice 1's 4 are in no piece"),
    ([((0, 4), 0, 2, 0)], "it has tensor-parallel slices [0] of 2"),
    ([((0, 8), None, 1, 0), ((0, 4), 1, 2, 0)], "mixes whole and tensor-parallel pieces"),
    ([((0, 4), 0, 2, 0), ((0, 4), 1, 2, 1)], "mixes tensor-parallel layouts"),
])
def test_verify_and_loading_make_one_coverage_check(tmp_path, pieces, words):
    entry = _entry(*pieces)
    with pytest.raises(CheckpointError) as loading:
        assemble("w", entry, lambda p: pytest.fail("a piece was read before its coverage was checked"))
    assert words in str(loading.value)
    m = Manifest(step=1, layout={}, config={}, tensors={"w": entry})
    with pytest.raises(CheckpointError) as verifying:
        verify(str(tmp_path), m, deep=False)
    assert str(verifying.value) == f"{tmp_path / 'manifest.json'}: {loading.value}"
    assert verify(str(tmp_path), Manifest(step=1, layout={}, config={}, tensors={}), deep=False).files == 0


def test_verify_counts_every_state_tensor(runs):
    m = read(str(runs / "a" / "step-00000003"))
    v = verify(str(runs / "a" / "step-00000003"), m, deep=True)
    kinds = {n.partition("/")[0] for n in m.tensors}
    assert kinds == {"param", "exp_avg", "exp_avg_sq"} and v.tensors == sum(len(e.pieces) for e in m.tensors.values())


@pytest.mark.timeout(120)
def test_a_command_never_overwrites_its_inputs(runs, tmp_path, capsys):
    data = tmp_path / "corpus.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 2000)
    before = data.read_text()
    _refused(*_cli(["train", "--nproc", "2", "--steps", "2", "--data", str(data), "--json-report", str(data), *QUICK],
                   capsys), "--json-report", "--data", "never overwrites")
    assert data.read_text() == before
    step3 = str(runs / "a" / "step-00000003")
    _refused(*_cli(["checkpoint", "consolidate", step3, "--out", os.path.join(step3, "model.safetensors")], capsys),
             "--out", "inside the checkpoint")
    assert "model.safetensors" not in os.listdir(step3)
    swap = tmp_path / "swap"
    swap.mkdir()
    _refused(*_cli(["train", "--nproc", "2", "--steps", "2", "--strategy", "zero2", "--offload-optimizer", "nvme",
                    "--nvme-path", str(swap), "--save-dir", str(swap), *QUICK], capsys), "--save-dir", "--nvme-path",
             "overlap")
    assert os.listdir(swap) == []


def test_no_output_writes_into_a_checkpoint_or_over_a_save_folders_names(runs, tmp_path, capsys, monkeypatch):
    forbid_ranks(monkeypatch)
    d = _copy(runs, tmp_path)                    # a save folder: latest, step-00000003/, step-00000006/
    step3 = os.path.join(d, "step-00000003")
    refused(capsys, tmp_path, ["checkpoint", "consolidate", d, "--out", os.path.join(d, "latest")],
            "--out", f"is 'latest' of save folder {d!r} (its pointer to the newest checkpoint)")
    assert open(os.path.join(d, "latest")).read().strip() == "step-00000006"
    train = ["train", "--nproc", "2", "--steps", "2", *QUICK, "--trace"]
    for trace, words in ((d, "is save folder"), (step3, "is checkpoint"), (os.path.join(step3, "t"), "is inside checkpoint"),
                         (os.path.join(d, "step-00000009"), f"is 'step-00000009' of save folder {d!r}")):
        refused(capsys, tmp_path, [*train, trace], f"--trace {trace!r} {words}", "only ringzero train writes there")
    new = str(tmp_path / "new")
    refused(capsys, tmp_path, [*train, new, "--save-dir", new], "is save folder", "this run's --save-dir")
    for free in (os.path.join(d, "model.safetensors"), os.path.join(d, "traces"), new):
        assert claimed(free) is None, free                  # beside the checkpoints, or in a plain folder


def test_a_save_dir_that_cannot_be_written_is_refused_before_ranks_start(capsys):
    _refused(*_cli(["train", "--nproc", "2", "--steps", "2", "--save-dir", "/proc/forbidden", *QUICK], capsys),
             "--save-dir '/proc/forbidden'", "cannot write in '/proc'")


def test_a_resume_of_another_shape_names_the_values_not_none(runs, capsys):
    _refused(*_resume(str(runs / "a"), capsys, "--layers", "8"), "another model", "its layers is 4, this run's 8")


def test_a_resume_that_changes_the_run_says_what_and_one_that_does_not_stays_quiet(runs):
    d = str(runs / "a" / "step-00000003")
    same = TrainConfig(steps=6, resume=d, **BASE)
    assert preflight.preflight(same, 2) == []
    changed = TrainConfig(steps=9, seed=3, resume=d, **{**BASE, "micro_batch": 4})
    (line,) = preflight.preflight(changed, 2)
    assert "global batch 4 -> 8" in line and "steps 6 -> 9" in line and "seed 0 -> 3" in line
    assert "differs from the unbroken run" in line
