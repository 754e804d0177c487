"""Activation recomputation changes memory, not numbers; an fp16 overflow on one rank skips the step
on every rank.

- Recomputation (Chen et al. 2016; Korthikanti et al. 2022): with the same seed, none / selective /
  full give bitwise equal losses and gradients, with dropout 0 and 0.1 (torch's checkpoint restores
  the RNG state before the re-run, so the recomputed dropout masks are the forward's), eager and sdpa
  attention; the bytes saved for backward fall strictly in the order none > selective > full. Also end
  to end: ZeRO-3 on 2 ranks (whose layers are re-gathered for the recomputed forward) trains to the
  same losses and parameters in every mode.
- fp16 (Micikevicius et al. 2018): an inf written into one parameter's gradient on rank 1 only,
  before the reduction, makes every rank skip the update (its ZeRO shard alone would be finite:
  the global-norm all-reduce carries the overflow) and halve `LossScaler.scale`; parameters and
  Adam's step count are unchanged on every rank, and the next clean step updates again.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ringzero.parallel.recompute import SavedBytes, apply_recompute
from ringzero.parallel.topology import Topology
from ringzero.plan.model.presets import model as preset
from ringzero.run.config import TrainConfig
from ringzero.train.data import ByteData, load_bytes
from ringzero.train.engine import RankResult, Trainer
from ringzero.train.rank import train_rank
from ringzero.train.model import GPT, AttentionCore

MODES = ("none", "selective", "full")


def _forward_backward(mode: str, attention: str, dropout: float):
    """(loss, saved bytes, gradients by parameter name) of one forward/backward of a fresh nano GPT."""
    shape = dataclasses.replace(preset("nano"), seq=64)
    torch.manual_seed(0)
    model = GPT(shape, attention=attention, dropout=dropout)
    apply_recompute(model, mode, (AttentionCore,))
    data = ByteData(load_bytes(None, 65536), shape.seq, seed=0)
    x, y = data.batch("train", 0, 2)
    torch.manual_seed(1)                      # the dropout masks' stream, the same in every mode
    with SavedBytes(model) as saved:
        loss = model(x, y)
    loss.backward()
    grads = {n.replace(".inner", ""): p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), saved.total, grads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attention", ("eager", "sdpa"))
@pytest.mark.parametrize("dropout", (0.0, 0.1))
def test_recompute_same_numbers_less_memory(attention, dropout):
    runs = {mode: _forward_backward(mode, attention, dropout) for mode in MODES}
    loss, _, grads = runs["none"]
    for mode in ("selective", "full"):
        l2, _, g2 = runs[mode]
        assert torch.equal(l2, loss), (mode, float(l2), float(loss))
        assert g2.keys() == grads.keys()
        for name, g in grads.items():
            assert torch.equal(g2[name], g), f"{mode}: gradient of {name} differs"
    saved = {mode: runs[mode][1] for mode in MODES}
    assert saved["none"] > saved["selective"] > saved["full"] > 0, saved


def _train_params(group, cfg):
    r = train_rank(cfg, keep_params=True, group=group, calibrate=False)
    return r.losses, torch.cat([torch.tensor(v) for _, v in sorted(r.params.items())])


@pytest.mark.timeout(180)
def test_recompute_under_zero3_trains_identically(pool):
    base = dict(model="nano", seq=32, micro_batch=2, grad_accum=2, steps=2, max_bytes=65536, eval_every=1000,
                eval_batches=1, strategy="zero3", dropout=0.1)
    runs = {mode: pool.run(_train_params, TrainConfig(recompute=mode, **base), world=2) for mode in MODES}
    for mode in ("selective", "full"):
        for rank, ((losses, params), (ref_losses, ref_params)) in enumerate(zip(runs[mode], runs["none"])):
            assert losses == ref_losses, (mode, rank, losses, ref_losses)
            assert torch.equal(params, ref_params), (mode, rank, float((params - ref_params).abs().max()))


# -- fp16 -----------------------------------------------------------------------------------------

POISONED = "blocks.1.mlp.fc.weight"


def _params(tr: Trainer) -> torch.Tensor:
    return torch.cat([torch.tensor(v) for _, v in sorted(tr.full_params().items())])


def _fp16_overflow(group, strategy: str):
    """Clean step, step with an inf in rank 1's gradient, clean step: what each rank saw."""
    cfg = TrainConfig(model="nano", seq=16, micro_batch=1, strategy=strategy, precision="fp16", steps=3,
                      max_bytes=65536, eval_every=1000, eval_batches=1)
    topo = Topology.data_parallel(group)
    tr = Trainer(cfg, topo)
    # The default first scale, 2^16 (torch's GradScaler's too), overflows this model's first fp16
    # backward by itself, as dynamic loss scaling expects; start lower so only the injected inf does.
    tr.scaler.scale = 2.0 ** 10
    res = RankResult(rank=topo.rank)
    seen = []

    def record():
        seen.append({"scale": tr.scaler.scale, "skipped": tr.scaler.skipped, "t": tr.opt.t, "params": _params(tr)})

    def poison(g):
        g = g.clone()
        g.view(-1)[0] = float("inf")
        return g

    try:
        record()
        tr.step(0, res)
        record()
        param = dict(tr.model.named_parameters())[POISONED]
        handle = param.register_hook(poison) if topo.rank == 1 else None
        tr.step(1, res)
        if handle is not None:
            handle.remove()
        record()
        tr.step(2, res)
        record()
    finally:
        tr.close()
    return seen


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ("dp", "zero1", "zero2", "zero3"))
def test_fp16_overflow_on_one_rank_skips_everywhere(pool, strategy):
    per_rank = pool.run(_fp16_overflow, strategy, world=2)
    for rank, (start, clean, poisoned, after) in enumerate(per_rank):
        label = f"{strategy} rank {rank}"
        assert clean["skipped"] == 0 and clean["t"] == 1, f"{label}: the clean first step overflowed"
        assert not torch.equal(clean["params"], start["params"]), f"{label}: the clean step changed nothing"
        assert poisoned["skipped"] == 1, f"{label}: the step with an inf was not skipped"
        assert poisoned["scale"] == clean["scale"] / 2, f"{label}: scale {clean['scale']} -> {poisoned['scale']}"
        assert poisoned["t"] == clean["t"], f"{label}: Adam's step count moved on a skipped step"
        assert torch.equal(poisoned["params"], clean["params"]), f"{label}: parameters moved on a skipped step"
        assert after["skipped"] == 1 and after["t"] == 2, f"{label}: the next clean step did not update"
        assert not torch.equal(after["params"], poisoned["params"])
    r0, r1 = per_rank
    for a, b in zip(r0, r1):                  # every rank saw the same thing, parameters bit for bit
        assert (a["scale"], a["skipped"], a["t"]) == (b["scale"], b["skipped"], b["t"])
        assert torch.equal(a["params"], b["params"])
