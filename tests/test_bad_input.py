"""Bad input on every command-line entry point: exit code 2, one line on stderr starting with
"ringzero: error:" that names what is wrong, no traceback, and nothing written in the working
folder. A bug inside a command after its checks is not bad input: "internal error", exit code 1.

Every case is refused before any rank starts; `launch` is replaced so that a case that slipped
through the checks fails at once instead of training."""

from __future__ import annotations

import json

import pytest

from ringzero import cli
from cli_errors import forbid_ranks, refused

MANIFEST = {"format": "ringzero.checkpoint/1", "step": 1, "layout": {}, "config": {},
            "tensors": {"param/w": {"shape": [2, 2], "dtype": "float32", "pieces": [
                {"file": "rank-00000.safetensors", "key": "w", "flat": [0, 4], "tp": None}]}}}


def _manifest(flat=(0, 4), file="rank-00000.safetensors", dtype="float32", shape=(2, 2), **top) -> str:
    d = json.loads(json.dumps(MANIFEST))
    d["tensors"]["param/w"]["pieces"][0].update(flat=list(flat), file=file)
    d["tensors"]["param/w"].update(dtype=dtype, shape=list(shape))
    return json.dumps({**d, **top})


def _safetensors(n: int = 4) -> bytes:
    """A valid safetensors file holding tensor "w", `n` float32 zeros (written without torch)."""
    head = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    return len(head).to_bytes(8, "little") + head + bytes(4 * n)


# checkpoint folder under ck/ -> (manifest.json, rank-00000.safetensors or None)
CHECKPOINTS = {
    "notjson": ("{not json", None),
    "binary": (b"\xff\xfe{}", None),
    "escape": (_manifest(file="../x"), None),
    "absolute": (_manifest(rng={"0": "/etc/passwd"}), None),
    "format": (json.dumps({"format": "other/9"}), None),
    "malformed": (_manifest(step="x"), None),
    "dtype": (_manifest(dtype="int8"), None),
    "nofile": (_manifest(), None),
    "badfile": (_manifest(), b"not a safetensors file"),
    "ok": (_manifest(), _safetensors()),
    "gap": (_manifest(flat=(0, 2)), _safetensors(2)),   # pieces leave half the tensor uncovered
    "header": (_manifest(flat=(0, 2), shape=(2,)), _safetensors()),  # a piece of 2 elements, a tensor of 4 in the file
}
# DeepSpeed configs under ds/
CONFIGS = {
    "syntax.json": '{"train_micro_batch_size_per_gpu": 2,}',
    "unknown.json": '{"zero_optimisation": {}}',
    "type.json": '{"train_micro_batch_size_per_gpu": "2"}',
    "fraction.json": '{"train_micro_batch_size_per_gpu": 2.5}',
    "stage.json": '{"zero_optimization": {"stage": 7}}',
    "accum.json": '{"gradient_accumulation_steps": 0}',
    "zerokey.json": '{"zero_optimization": {"stage": 3, "bogus": 1}}',
    "flag.json": '{"fp16": {"enabled": "yes"}}',
    "both.json": '{"fp16": {"enabled": true}, "bf16": {"enabled": true}}',
    "list.json": "[1, 2]",
    "dup.json": '{"steps_per_print": 1, "steps_per_print": 2}',
    "nan.json": '{"gradient_clipping": NaN}',
    "optimizer.json": '{"optimizer": {"type": "SGD"}}',
    "betas.json": '{"optimizer": {"params": {"betas": [0.9]}}}',
    "batch.json": '{"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}',
}

CASES = [
    # ringzero plan
    ("plan --model nosuch", "unknown model 'nosuch'; allowed: nano"),
    ("plan --layers 2 --hidden 64", "missing --heads, --vocab, --seq"),
    ("plan --layers 2 --hidden 64 --heads 3 --vocab 100 --seq 32", "hidden=64 must be divisible by heads=3"),
    ("plan --model llama-2-7b --tp 3", "--tp 3 must divide the 32 attention heads; allowed: 1, 2, 4"),
    ("plan --model llama-2-7b --gpu h999", "unknown gpu 'h999'; allowed:"),
    ("plan --model llama-2-7b --tokens -5B", "--tokens must be > 0"),
    ("plan --model llama-2-7b --tokens lots", "--tokens='lots' is not a number"),
    ("plan --model llama-2-7b --hbm 80XB", "unknown unit 'xb'; allowed:"),
    ("plan --model llama-2-7b --hbm 0", "--hbm must be > 0"),
    ("plan --model llama-2-7b --inter-bw -3GB/s", "--inter-bw must be > 0"),
    ("plan --model llama-2-7b --intra-bw fast", "--intra-bw='fast' is not a number"),
    ("plan --model llama-2-7b --plot nodir/x.png", "does not exist"),
    ("plan --model llama-2-7b --plot x.doc", "format .doc is not one matplotlib writes; allowed: .png"),
    ("plan --model llama-2-7b --plot /proc/x.png", "cannot write in '/proc'"),   # unwritable even for root
    ("plan --model llama-2-7b --servers 0", "--servers must be >= 1, got 0"),
    ("plan --model llama-2-7b --gpus 8 --tp 2 --servers 2", "--servers plans plain data parallelism"),
    ("plan --model llama-2-7b --zero 5", "--zero=5 is not supported; allowed: 0, 1, 2, 3"),
    ("plan --model llama-2-7b --precision fp12", "allowed: fp32, bf16, fp16"),
    ("plan --model llama-2-7b --gpus 0", "--gpus must be >= 1, got 0"),
    ("plan --model llama-2-7b --pp 100", "more stages than the 32 layers"),
    ("plan --model llama-2-7b --gpus 6 --tp 4", "--gpus 6 is not divisible by tp x pp"),
    ("plan --model llama-2-7b --gpus 8 --dp 3", "must equal --gpus 8"),
    ("plan --model llama-2-7b --days -1", "--days must be > 0"),
    ("plan --model llama-2-7b --mfu 2", "--mfu must be in (0, 1]"),
    ("plan --model llama-2-7b --gpus 8 --global-batch 3", "--global-batch=3 must be a multiple"),
    ("plan --model llama-2-7b --gpus 12 --gpus-per-node 8", "does not fill whole nodes"),
    ("plan --model llama-2-7b --hidden abc", "argument --hidden: invalid int value"),
    # ringzero train: flags, paths and memory, all before a rank starts
    ("train --strategy zero9", "argument --strategy: invalid choice: 'zero9'"),
    ("train --steps 0", "steps must be >= 1, got 0"),
    ("train --tp 3", "tp=3 does not divide the heads (4)"),
    ("train --data nosuch.txt", "data path 'nosuch.txt' does not exist"),
    ("train --data tiny.txt", "fewer than a sequence of 256 + 1"),
    ("train --data empty", "data folder 'empty' has no files"),
    ("train --json-report nodir/r.json", "--json-report 'nodir/r.json': folder"),
    ("train --nproc 0", "--nproc must be >= 1, got 0"),
    ("train --nproc 100000", "100000 ranks need about"),
    ("train --seq 100000", "use fewer ranks, a smaller --micro-batch or --seq, or --force"),
    ("train --save-dir nodir/ck", "--save-dir 'nodir/ck': folder"),
    ("train --save-dir tiny.txt", "--save-dir 'tiny.txt' is a file"),
    ("train --resume empty", "'empty' holds no complete checkpoint"),
    ("train --resume tiny.txt", "checkpoint 'tiny.txt' is a file; give a checkpoint folder or a --save-dir"),
    ("train --offload-optimizer nvme --nvme-path nowhere --strategy zero3", "nvme_path 'nowhere' does not exist"),
    ("train --resume ck/escape", "manifest names a file outside its directory: '../x'"),
    ("train --init-from tiny.txt", "--init-from 'tiny.txt' is not a safetensors file"),
    ("train --init-from nosuch.safetensors", "is not a file"),
    ("train --straggler 1x2", "--straggler '1x2': give RANK:FACTOR"),
    ("train --straggler 5:2 --nproc 2", "straggler rank 5 is not a worker rank"),
    ("train --inject-nonfinite a:b", "--inject-nonfinite 'a:b': give RANK:STEP"),
    ("train --inject-nonfinite 0:500 --steps 10", "step 500 is not one of the 10 steps"),
    ("train --inject-nonfinite 3:1 --nproc 2", "--inject-nonfinite rank 3 is not one of the 2 ranks"),
    ("train --max-restarts 1", "max_restarts restarts from the latest checkpoint: it needs save_dir"),
    ("train --save-every 5", "save_every needs save_dir"),
    ("train --lr -1", "lr must be > 0"),
    ("train --dropout 1.5", "dropout must be in [0, 1)"),
    ("train --pp 2 --nproc 2 --strategy zero3", "cannot run under pipeline parallelism"),
    ("train --strategy single --nproc 2", "--strategy single runs on one rank"),
    ("train --timeout 0", "--timeout must be > 0 seconds"),
    ("train --stall-timeout -5", "--stall-timeout must be > 0 seconds"),
    ("train --pipeline-cost abc", "--pipeline-cost 'abc': give forward and backward milliseconds"),
    ("train --emulate-inter-node 0", "--emulate-inter-node must be > 0, got '0'"),
    ("train --zeropp bogus --strategy zero3", "zeropp 'bogus': allowed any of qwz, hpz, qgz"),
    ("train --resume", "--resume without a folder"),
    ("train --strategey zero2", "unrecognized arguments: --strategey zero2; did you mean --strategy?"),
    ("plan --modle llama-2-7b", "unrecognized arguments: --modle llama-2-7b; did you mean --model?"),
    ("simulate collective --gpus 16 --nvlnk-bw 5", "did you mean --nvlink-bw?"),
    ("train --layout auto --tp 2 --nproc 2", "--layout auto chooses --tp itself"),
    ("train --nproc 2 --dp 3", "dp x tp = 3 x 1 = 3 must equal the 2 ranks"),
    ("train --strategy ps --nproc 2", "needs servers >= 1"),
    # ringzero train --config: DeepSpeed JSON
    ("train --config nosuch.json", "config file 'nosuch.json' does not exist"),
    ("train --config ds", "config file 'ds' is a folder"),
    ("train --config ds/syntax.json", "is not valid JSON: Expecting property name"),
    ("train --config ds/unknown.json", "unknown DeepSpeed config key 'zero_optimisation'; did you mean zero_optimization?"),
    ("train --config ds/type.json", "train_micro_batch_size_per_gpu must be an integer, got '2'"),
    ("train --config ds/fraction.json", "train_micro_batch_size_per_gpu must be an integer, got 2.5"),
    ("train --config ds/stage.json", "zero_optimization.stage=7; allowed: 0, 1, 2, 3"),
    ("train --config ds/accum.json", "gradient_accumulation_steps in 'ds/accum.json': grad_accum must be >= 1"),
    ("train --config ds/zerokey.json", "unknown zero_optimization key 'bogus'"),
    ("train --config ds/flag.json", "fp16.enabled must be true or false, got 'yes'"),
    ("train --config ds/both.json", "enable at most one"),
    ("train --config ds/list.json", "must hold a JSON object, got list"),
    ("train --config ds/dup.json", "key 'steps_per_print' appears more than once"),
    ("train --config ds/nan.json", "gradient_clipping must be a finite number"),
    ("train --config ds/optimizer.json", "optimizer.type='SGD'; allowed: Adam, AdamW"),
    ("train --config ds/betas.json", "betas must be a list of two numbers"),
    ("train --config ds/batch.json", "train_batch_size=7 != train_micro_batch_size_per_gpu 2 x "
     "gradient_accumulation_steps 2 x 1 data-parallel rank = 4"),
    # ringzero bench comm|train|ps
    ("bench comm --sizes 0", "bad size '0': must be at least 1 byte"),
    ("bench comm --sizes 1XB", "bad size '1XB' for --sizes"),
    ("bench comm --sizes -4KiB", "bad size '-4KiB' for --sizes"),
    ("bench comm --sizes ,", "--sizes needs at least one value"),
    ("bench comm --collective all_reduse", "unknown collective 'all_reduse'; valid:"),
    ("bench comm --algorithm warp", "unknown algorithm 'warp'"),
    ("bench comm --nproc 0", "--nproc must be at least 1, got 0"),
    ("bench comm --dtype complex64", "unsupported --dtype 'complex64'; allowed:"),
    ("bench comm --worlds 9", "--worlds must lie in 1..--nproc (4), got 9"),
    ("bench comm --worlds a,b", "--worlds takes comma-separated integers"),
    ("bench comm --plot nodir/x.png", "--plot 'nodir/x.png': folder"),
    ("bench comm --calibrate --out nodir/cal.json", "--out 'nodir/cal.json': folder"),
    ("bench comm --out cal.json", "--out names the calibration file: it needs --calibrate"),
    ("bench comm --emulate-inter-node 0", "--emulate-inter-node must be > 0, got '0'"),
    ("bench comm --sizes 2 --collective all_reduce", "size 2 B holds no float32 element per rank"),
    ("bench train --nproc 1", "--nproc must be at least 2 for dp and zero3"),
    ("bench train --suites foo", "--suites 'foo': allowed dp, zero3, recompute"),
    ("bench train --tp 3", "give --tp equal to --nproc (2)"),
    ("bench train --torch-adam slow", "--torch-adam 'slow': allowed foreach, fused"),
    ("bench train --algorithm warp", "comm_algorithm 'warp' is not supported; allowed:"),
    ("bench train --json nodir/x.json", "--json 'nodir/x.json': folder"),
    ("bench ps --nproc 1", "--nproc must be >= 2 (worker 1 is the straggler)"),
    ("bench ps --staleness 1,x --plot p.png", "--staleness takes comma-separated integers"),
    ("bench ps --straggler 0.5 --plot p.png", "factor >= 1"),
    ("bench ps --plot nodir/x.png", "--plot 'nodir/x.png': folder"),
    ("bench ps --plot p.png --json nodir/x.json", "--json 'nodir/x.json': folder"),
    # ringzero explain
    ("explain all-reduse", "unknown collective 'all-reduse'; valid: all-reduce"),
    ("explain all-reduce --algorithm warp", "cannot explain algorithm 'warp' for all_reduce; valid:"),
    ("explain all-reduce --algorithm auto", "have no steps of their own to show"),
    ("explain all-reduce --world 0", "world must be between 1 and 16"),
    ("explain all-reduce --world 17", "world must be between 1 and 16"),
    ("explain reduce --root 5", "root 5 is not a rank of a world of 4; allowed: 0..3"),
    ("explain all-reduce --root 1", "--root applies only to"),
    ("explain all-reduce --ranks-per-node 0", "ranks per node must be >= 1"),
    ("explain all-reduce --bytes 1", "--bytes 1 holds no float32 element"),
    ("explain all-reduce --bytes -4KiB", "bad size '-4KiB' for --bytes"),
    # ringzero checkpoint inspect|consolidate
    ("checkpoint inspect nosuch", "checkpoint 'nosuch' does not exist"),
    ("checkpoint inspect empty", "'empty' holds no complete checkpoint"),
    ("checkpoint inspect tiny.txt", "checkpoint 'tiny.txt' is a file"),
    ("checkpoint inspect ck/notjson", "manifest.json: manifest is not JSON"),
    ("checkpoint inspect ck/binary", "manifest.json is not UTF-8 text"),
    ("checkpoint inspect ck/escape", "manifest names a file outside its directory: '../x'"),
    ("checkpoint inspect ck/absolute", "manifest names a file outside its directory: '/etc/passwd'"),
    ("checkpoint inspect ck/format", "not a ringzero checkpoint manifest"),
    ("checkpoint inspect ck/malformed", "manifest 'step' must be an integer >= 0, got 'x'"),
    ("checkpoint inspect ck/dtype", "has dtype 'int8'; allowed: float32"),
    ("checkpoint consolidate ck/notjson --out m.safetensors", "manifest is not JSON"),
    ("checkpoint consolidate ck/ok --out nodir/m.safetensors", "--out 'nodir/m.safetensors': folder"),
    ("checkpoint consolidate ck/ok --out empty", "--out 'empty' is a folder"),
    ("checkpoint consolidate ck/nofile --out m.safetensors", "lists rank-00000.safetensors, which is missing"),
    ("checkpoint consolidate ck/badfile --out m.safetensors", "cannot read"),
    ("checkpoint consolidate ck/gap --out m.safetensors", "is incomplete"),
    ("checkpoint inspect ck/gap --verify", "tensor 'param/w' is incomplete: elements [2, 4) of its 4 are in no piece"),
    ("checkpoint consolidate ck/header --out m.safetensors", "tensor 'w' is F32 x 4 in the file, F32 x 2 in the manifest"),
    ("checkpoint consolidate ck/ok", "the following arguments are required: --out"),
]


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """The working folder with the inputs the cases name; no rank can start."""
    monkeypatch.chdir(tmp_path)
    forbid_ranks(monkeypatch)
    (tmp_path / "tiny.txt").write_text("abc" * 5)
    (tmp_path / "empty").mkdir()
    (tmp_path / "ds").mkdir()
    for name, text in CONFIGS.items():
        (tmp_path / "ds" / name).write_text(text)
    for name, (manifest, data) in CHECKPOINTS.items():
        step = tmp_path / "ck" / name / "step-00000001"
        step.mkdir(parents=True)
        (step / "manifest.json").write_bytes(manifest if isinstance(manifest, bytes) else manifest.encode())
        if data is not None:
            (step / "rank-00000.safetensors").write_bytes(data)
    return tmp_path


@pytest.mark.parametrize("line,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cwd, capsys, line, expected):
    refused(capsys, cwd, line.split(), expected)


def test_the_cases_are_distinct():
    assert len({c[0] for c in CASES}) == len(CASES) >= 60


def test_a_bug_after_the_checks_is_an_internal_error_not_bad_input(cwd, capsys, monkeypatch):
    # The checks pass; what fails afterwards is ringzero's own code and must not read as bad input.
    def broken(*args, **kwargs):
        raise TypeError("estimate() got an unexpected keyword argument")

    monkeypatch.setattr("ringzero.commands.plan.estimate", broken)
    code = cli.main(["plan", "--model", "gpt2"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("ringzero: internal error: TypeError") and len(err.splitlines()) == 1, err
    assert "ringzero: error:" not in err
