"""Your own model as a 2-stage pipeline with ringzero: a 5-layer MLP learns y = sum(x), cut before "fc2".

    python examples/pp_mlp.py                                     # 2 local ranks (ringzero.launch)
    torchrun --nproc-per-node 2 examples/pp_mlp.py                # the same under torchrun
"""

import sys
from collections import OrderedDict

import torch
from torch import nn

from ringzero.launch import run
from ringzero.parallel import AdamConfig, wrap


def train(steps: int = 50) -> dict:
    torch.manual_seed(0)                                          # every rank: the same initial model
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(16, 64), act1=nn.GELU(), fc2=nn.Linear(64, 64),
                                      act2=nn.GELU(), head=nn.Linear(64, 1)))
    engine = wrap(model, strategy="dp", optimizer=AdamConfig(lr=1e-2), pp_split=["fc2"],
                  schedule="1f1b", microbatches=4, loss_fn=nn.functional.mse_loss)
    data = torch.Generator().manual_seed(100)                     # both stages see one replica's batches
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=data)
        out = engine.step(x, target=x.sum(dim=1, keepdim=True))  # 4 micro-batches of 8
        losses.append(out["loss"])                                # None but on the last stage
    twins = {t.name: (t.predicted, t.measured, t.unit) for t in engine.twins()}
    engine.close()
    return {"rank": torch.distributed.get_rank(), "stage": engine.topology.pp_rank,
            "holds": [n for n, _ in model.named_children()], "losses": losses, "twins": twins}


def report(r: dict) -> str:
    head = f"rank {r['rank']} (stage {r['stage']}: {', '.join(r['holds'])})"
    if r["losses"][0] is not None:
        head += f": loss {r['losses'][0]:.3f} at the first step, {r['losses'][-1]:.3f} at the last"
    short = {"bytes": "B"}
    lines = [head] + [f"  {name}: planner {p:,.0f} {short.get(u, u)}, measured {m:,.0f} {short.get(u, u)}"
                      for name, (p, m, u) in r["twins"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    out = run(train, nproc=2)        # a list of every rank's result locally; this rank's under torchrun
    for r in out if isinstance(out, list) else [out]:
        sys.stdout.write(report(r))  # one write: torchrun's ranks share the terminal
