"""The torch pipeline peer trains the same model as a single process: its losses under GPipe, 1F1B
and interleaved 1F1B on two ranks equal those of the plain GPT with the same AdamW on the same
batches, within fp32 rounding (1e-5 relative), on every rank.

Three steps, because Adam's first update does not depend on the gradients' scale: only the third
loss shows a clipping coefficient that is wrong (say, the tied weight counted twice in the norm)."""

import pytest
import torch

from ringzero.bench import pp_peer
from ringzero.run.config import TrainConfig
from ringzero.train.data import ByteData, load_bytes
from ringzero.train.model import GPT

BASE = dict(model="nano", steps=3, micro_batch=1, max_bytes=1 << 16, eval_every=100,
            eval_batches=1, warmup=1, clip=0.5, weight_decay=0.1)
RTOL = 1e-5


def _reference(group, cfg: TrainConfig) -> list[float]:
    data = ByteData(load_bytes(cfg.training.data, cfg.training.max_bytes), cfg.shape.seq, seed=cfg.training.seed)
    torch.manual_seed(cfg.training.seed)
    model = GPT(cfg.shape, attention=cfg.model.attention)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps,
                            weight_decay=cfg.optim.weight_decay)
    losses = []
    for i in range(cfg.training.steps):
        x, y = data.batch("train", i, cfg.training.micro_batch * cfg.training.grad_accum)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip)
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(i)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule, v, accum", [("gpipe", 1, 2), ("1f1b", 1, 4), ("interleaved", 2, 4)])
def test_torch_pipeline_losses_equal_single_process(pool, schedule, v, accum):
    cfg = TrainConfig(**BASE, grad_accum=accum)
    ref = pool.run(_reference, cfg, world=1)[0]
    out = pool.run(pp_peer.train, cfg, schedule, v, world=2)
    for rank, r in enumerate(out):
        assert len(r["times"]) == cfg.training.steps and all(t > 0 for t in r["times"])
        assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(r["losses"], ref, strict=True)), \
            f"rank {rank}: {r['losses']} != {ref}"
