"""`ringzero checkpoint inspect|consolidate`, `ringzero train --save-dir/--resume/--init-from`: the
full-model file holds every weight (its fp32 master), loads with safetensors and into any layout;
bad paths are one line, exit 2, and nothing written."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from ringzero import cli
from ringzero.checkpoint.load import Reader
from ringzero.parallel.topology import Topology
from ringzero.run.config import TrainConfig
from ringzero.train.engine import Trainer
from ringzero.train.rank import train_rank

BASE = dict(model="nano", seq=16, eval_every=1000, eval_batches=1, max_bytes=1 << 15, warmup=2)
QUICK = ["--seq", "16", "--micro-batch", "2", "--max-bytes", "32768", "--eval-batches", "1", "--quiet"]


def _train(group, cfg):
    return train_rank(cfg, group=group, calibrate=False)


def _weights_after_init(group, cfg):
    import torch.distributed as dist
    p = cfg.placement(dist.get_world_size(group))
    t = Trainer(cfg, Topology.build(p, group))
    out = {k: torch.tensor(v) for k, v in t.full_params().items()}
    t.close()
    return out


@pytest.fixture(scope="module")
def saved(pool, tmp_path_factory):
    """A bf16 ZeRO-3 run on 2 ranks, saved at its last step (3)."""
    root = tmp_path_factory.mktemp("ck")
    pool.run(_train, TrainConfig(strategy="zero3", precision="bf16", micro_batch=2, steps=3, save_dir=str(root),
                                 **BASE), world=2)
    return root


@pytest.mark.timeout(300)
def test_consolidate_writes_every_weight_and_any_layout_starts_from_it(pool, saved, tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    assert cli.main(["checkpoint", "consolidate", str(saved), "--out", str(out)]) == 0
    weights = load_file(str(out))
    r = Reader(str(saved / "step-00000003"))
    names = sorted(n.partition("/")[2] for n in r.manifest.tensors if n.startswith("param/"))
    assert sorted(weights) == names
    for n in names:
        assert weights[n].dtype == torch.float32 and torch.equal(weights[n], r.tensor(f"master/{n}"))
    cfg = TrainConfig(strategy="zero1", tp=2, micro_batch=2, steps=2, init_from=str(out), **BASE)
    got = pool.run(_weights_after_init, cfg, world=4)[0]
    assert sorted(got) == names
    for n in names:                           # an fp32 run holds the masters exactly
        assert torch.equal(got[n].reshape(weights[n].shape), weights[n]), n
    both = tmp_path / "all.safetensors"
    assert cli.main(["checkpoint", "consolidate", str(saved), "--out", str(both), "--with-optimizer"]) == 0
    full = load_file(str(both))
    assert {k for k in full if k.startswith("exp_avg/")} == {f"exp_avg/{n}" for n in names}
    assert torch.equal(full[f"exp_avg_sq/{names[0]}"], r.tensor(f"exp_avg_sq/{names[0]}"))


def test_inspect_prints_the_step_and_layout(saved, capsys):
    assert cli.main(["checkpoint", "inspect", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "step 3" in out and "zero3" in out and "param/wte.weight" in out


@pytest.mark.parametrize("argv, message", [
    (["checkpoint", "inspect", "/no/such/ckpt"], "does not exist"),
    (["checkpoint", "consolidate", "{saved}", "--out", "/no/such/dir/m.safetensors"], "does not exist"),
    (["checkpoint", "consolidate", "{empty}", "--out", "{tmp}/m.safetensors"], "no complete checkpoint"),
    (["train", "--resume", "{empty}", *QUICK], "no complete checkpoint"),
    (["train", "--resume", "{saved}", "--steps", "3", *QUICK], "nothing is left to run"),
    (["train", "--resume", "{saved}", "--steps", "9", "--model", "micro", *QUICK], "of another model"),
    (["train", "--resume", *QUICK], "give --save-dir or --resume DIR"),
    (["train", "--save-every", "2", *QUICK], "needs save_dir"),
    (["train", "--save-dir", "{tmp}/ck", "--keep", "0", *QUICK], "keep must be an integer >= 1"),
    (["train", "--save-dir", "/no/such/dir/ck", *QUICK], "does not exist"),
    (["train", "--init-from", "{tmp}/none.safetensors", *QUICK], "is not a file"),
    (["train", "--init-from", "{saved}/latest", *QUICK], "is not a safetensors file"),
    (["train", "--strategy", "ps", "--servers", "1", "--nproc", "2", "--init-from", "{tmp}/none.safetensors",
      *QUICK], "not available with strategy 'ps'"),
])
def test_bad_checkpoint_input_is_one_line_and_writes_nothing(argv, message, saved, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    before = sorted(os.listdir(tmp_path))
    argv = [a.format(saved=saved, empty=empty, tmp=tmp_path) for a in argv]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert sorted(os.listdir(tmp_path)) == before
