"""Your own model under ZeRO-2 with ringzero: a 3-layer MLP learns y = sum(x) on 2 ranks.

    python examples/zero2_mlp.py                                  # 2 local ranks (ringzero.launch)
    torchrun --nproc-per-node 2 examples/zero2_mlp.py             # the same under torchrun
"""

import sys

import torch
from torch import nn

from ringzero.launch import run
from ringzero.parallel import AdamConfig, wrap


def train(steps: int = 50) -> dict:
    torch.manual_seed(0)                                          # every rank: the same initial model
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))
    engine = wrap(model, strategy="zero2", optimizer=AdamConfig(lr=1e-2), grad_accum=2)
    rank = torch.distributed.get_rank()
    data = torch.Generator().manual_seed(100 + rank)               # each rank its own batches
    losses = []
    for _ in range(steps):
        for _ in range(2):                                        # grad_accum micro-batches a step
            x = torch.randn(32, 16, generator=data)
            loss = (engine(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    twins = {t.name: (t.predicted, t.measured) for t in engine.twins()}
    state = engine.state_dict()
    engine.close()
    return {"rank": rank, "losses": losses, "twins": twins, "weights": sorted(state["model"])}


def report(r: dict) -> str:
    lines = [f"rank {r['rank']}: loss {r['losses'][0]:.3f} at the first step, {r['losses'][-1]:.3f} at the last"]
    lines += [f"  {name}: planner {p:,.0f} B, measured {m:,.0f} B" for name, (p, m) in r["twins"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    out = run(train, nproc=2)        # a list of every rank's result locally; this rank's under torchrun
    for r in out if isinstance(out, list) else [out]:
        sys.stdout.write(report(r))  # one write: torchrun's ranks share the terminal
