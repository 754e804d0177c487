"""`ringzero.parallel.wrap`: your own model under DP, ZeRO-1/2/3 (and tensor parallelism by a plan),
or cut into pipeline stages, in one call.

- every strategy trains a 3-layer MLP exactly as one process with torch's AdamW and clipping does
  on all ranks' batches (losses and final weights to 1e-5 relative, fp32);
- so does a pipeline of it (cut at names or into a number of stages, GPipe and 1F1B, alone and
  under ZeRO-1 over 2 replicas): the last stage's losses, every step's gradient norm, the weights;
- its twins: bytes on the wire per step exact (a pipeline's messages too), bytes held within the
  buckets' padding, a pipeline's micro-batches held at its peak exact;
- `state_dict` / `load_state_dict` resume bit for bit;
- misuse is one clear error; the documented examples run, locally and under torchrun.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
STEPS, ACCUM, BATCH, LR, CLIP = 3, 2, 4, 1e-2, 0.5


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 1))


def _batch(rank: int, step: int, k: int) -> torch.Tensor:
    return torch.randn(BATCH, 8, generator=torch.Generator().manual_seed(1000 * rank + 10 * step + k))


def _loss(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (out - x.sum(dim=1, keepdim=True)).pow(2).mean()


def _own_seed(group, apart: bool) -> int:
    """The seed this rank builds its model with: 0 everywhere, or with `apart` 0 on the first rank
    only, so that the engine must start every rank from the first rank's weights."""
    return torch.distributed.get_rank(group) * 7 if apart else 0


def _train(group, strategy: str, tp: int = 1, steps: int = STEPS, state=None, apart: bool = False):
    from ringzero.parallel import AdamConfig, wrap
    plan = {"0": "colwise", "2": "rowwise"} if tp > 1 else None     # Linear(8,32) by columns, (32,32) by rows
    engine = wrap(_mlp(_own_seed(group, apart)), strategy=strategy, optimizer=AdamConfig(lr=LR, clip=CLIP), group=group,
                  grad_accum=ACCUM, bucket_mb=0.001, tp=tp, tp_plan=plan)
    dp_rank = engine.topology.dp_rank
    start = 0
    if state is not None:
        engine.load_state_dict(state[torch.distributed.get_rank(group)])
        start = STEPS
    losses = []
    for step in range(start, start + steps):
        for k in range(ACCUM):
            x = _batch(dp_rank, step, k)
            loss = _loss(engine(x), x)
            engine.backward(loss)
            losses.append(loss.item())
        engine.step()
    twins = [(t.name, t.predicted, t.measured) for t in engine.twins()]
    sd = engine.state_dict()
    engine.close()
    return losses, {k: v.clone() for k, v in sd["model"].items()}, twins, sd


def _reference(dp: int):
    """One process, torch's AdamW and clip_grad_norm_ on every rank's micro-batch of each step."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = {r: [] for r in range(dp)}
    for step in range(STEPS):
        opt.zero_grad()
        for k in range(ACCUM):
            for r in range(dp):
                x = _batch(r, step, k)
                loss = _loss(model(x), x)
                (loss / (dp * ACCUM)).backward()
                losses[r].append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


def _close(a, b) -> bool:
    return torch.allclose(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["dp", "zero1", "zero2", "zero3"])
def test_every_strategy_trains_as_one_process_and_its_twins_hold(pool, strategy):
    from ringzero.parallel.optimizer import AdamConfig
    assert AdamConfig().betas == (0.9, 0.999) and AdamConfig().eps == 1e-8     # the reference's
    ref_losses, ref_weights = _reference(2)
    for rank, (losses, weights, twins, _) in enumerate(pool.run(_train, strategy, world=2)):
        assert _close(losses, ref_losses[rank]), (losses, ref_losses[rank])
        for name, w in ref_weights.items():
            assert _close(weights[name], w), name
        by = {name: (p, m) for name, p, m in twins}
        assert by["bytes sent per step"][0] == by["bytes sent per step"][1] > 0
        assert by["bytes recv per step"][0] == by["bytes recv per step"][1] > 0
        for held in ("params held", "grads held", "optimizer held"):
            predicted, measured = by[held]
            assert 0 <= measured - predicted < 3 * 2 * 4 * 8, (held, predicted, measured)   # ≤ dp-1 pad per bucket


@pytest.mark.timeout(120)
def test_a_tensor_parallel_plan_then_data_parallel_trains_as_one_process(pool):
    """tp 2 x dp 2 on 4 ranks: the first linear split by columns, the second by rows."""
    ref_losses, _ = _reference(2)
    out = pool.run(_train, "zero2", 2, world=4)
    for rank, (losses, *_rest) in enumerate(out):
        dp_rank = rank // 2       # Placement: tp is the fastest-varying dimension
        assert _close(losses, ref_losses[dp_rank]), (rank, losses, ref_losses[dp_rank])


@pytest.mark.timeout(120)
def test_state_dict_resumes_bit_for_bit(pool):
    whole = pool.run(_train, "zero2", 1, 2 * STEPS, world=2)
    first = pool.run(_train, "zero2", world=2)
    states = [sd for *_rest, sd in first]
    resumed = pool.run(_train, "zero2", 1, STEPS, states, world=2)
    for (losses, weights, _, _), (l1, *_a), (l2, w2, _, _) in zip(whole, first, resumed):
        assert losses == l1 + l2
        assert all(torch.equal(weights[k], w2[k]) for k in weights)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy, tp, world", [("dp", 1, 2), ("zero1", 1, 2), ("zero2", 1, 2), ("zero3", 1, 2),
                                                 ("zero2", 2, 4)])
def test_replicas_built_from_different_seeds_start_from_the_first_ranks(pool, strategy, tp, world):
    """Every rank but the first builds its model from another seed: the engine broadcasts the first
    rank's weights before splitting or sharding them (as DDP does), so training still matches one
    process that started from the first rank's model."""
    ref_losses, ref_weights = _reference(world // tp)
    for rank, (losses, weights, *_rest) in enumerate(pool.run(_train, strategy, tp, STEPS, None, True, world=world)):
        assert _close(losses, ref_losses[rank // tp]), (rank, losses)
        for name, w in ref_weights.items() if tp == 1 else ():      # under tp: this rank's slices
            assert _close(weights[name], w), (rank, name)


def _buffers_after_wrap(group, strategy: str):
    from ringzero.parallel import AdamConfig, wrap
    rank = torch.distributed.get_rank(group)
    model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    with torch.no_grad():
        model[1].running_mean.fill_(float(rank))
        model[1].running_var.fill_(1.0 + rank)
        model[1].num_batches_tracked.fill_(rank)
    engine = wrap(model, strategy=strategy, optimizer=AdamConfig(), group=group)
    out = {k: v.clone() for k, v in engine.module.named_buffers()}
    engine.close()
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["dp", "zero3"])
def test_buffers_start_as_the_first_ranks(pool, strategy):
    for got in pool.run(_buffers_after_wrap, strategy, world=2):
        assert torch.equal(got["1.running_mean"], torch.zeros(4))
        assert torch.equal(got["1.running_var"], torch.ones(4))
        assert int(got["1.num_batches_tracked"]) == 0


MICRO = 4


def _pipelined(group, schedule: str, split, strategy: str, apart: bool = False):
    """This stage's per-step results, its weights by name and its twins."""
    from ringzero.parallel import AdamConfig, wrap
    engine = wrap(_mlp(_own_seed(group, apart)), strategy=strategy, optimizer=AdamConfig(lr=LR, clip=CLIP), group=group,
                  bucket_mb=0.001, pp_split=split, schedule=schedule, microbatches=MICRO, loss_fn=_loss_y)
    steps = []
    for step in range(STEPS):
        x = _pipeline_batch(engine.topology.dp_rank, step)
        steps.append(engine.step(x, target=x.sum(dim=1, keepdim=True)))
    twins = [(t.name, t.predicted, t.measured) for t in engine.twins()]
    weights = {k: v.clone() for k, v in engine.state_dict()["model"].items()}
    engine.close()
    return steps, weights, twins, engine.topology.pp_rank


def _pipeline_batch(dp_rank: int, step: int) -> torch.Tensor:
    return torch.randn(MICRO * BATCH, 8, generator=torch.Generator().manual_seed(500 + 10 * dp_rank + step))


def _loss_y(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out - y).pow(2).mean()


def _pipeline_reference(dp: int):
    """One process on every replica's micro-batches: losses per replica, the clipped gradient's norm
    per step (torch's `clip_grad_norm_`), the final weights."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses, norms = {r: [] for r in range(dp)}, []
    for step in range(STEPS):
        opt.zero_grad()
        for r in range(dp):
            for x in _pipeline_batch(r, step).chunk(MICRO):
                loss = _loss_y(model(x), x.sum(dim=1, keepdim=True))
                (loss / (dp * MICRO)).backward()
                losses[r].append(loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
    return losses, norms, {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule, split, strategy, world, apart", [
    ("gpipe", ["2"], "dp", 2, False), ("1f1b", ["2"], "dp", 2, False), ("1f1b", 2, "dp", 2, True),
    ("1f1b", ["2"], "zero1", 4, True)])
def test_a_pipeline_trains_as_one_process_and_its_twins_hold(pool, schedule, split, strategy, world, apart):
    """2 stages (cut before child "2"; the int split balances the parameters to the same cut), alone
    on 2 ranks or under ZeRO-1 over 2 replicas on 4 (rank = stage x dp + dp rank); with `apart`,
    every rank but the first builds its model from another seed (the first rank's is broadcast)."""
    dp = world // 2
    ref_losses, ref_norms, ref_weights = _pipeline_reference(dp)
    out = pool.run(_pipelined, schedule, split, strategy, apart, world=world)
    seen = set()
    for rank, (steps, weights, twins, stage) in enumerate(out):
        assert stage == rank // dp
        losses = [l for s in steps for l in s["losses"]]
        assert _close(losses, ref_losses[rank % dp] if stage == 1 else []), (rank, losses)
        assert _close([s["grad_norm"] for s in steps], ref_norms)              # the gradients, whole
        for name, w in weights.items():
            assert _close(w, ref_weights[name]), name
        seen |= set(weights)
        by = {name: (p, m) for name, p, m in twins}
        for row in ("bytes sent per step", "bytes recv per step", "pipeline bytes sent per step",
                    "pipeline bytes recv per step", "micro-batches held at peak"):
            assert by[row][0] == by[row][1] > 0, (row, by[row])
        assert by["pipeline bytes sent per step"][0] == MICRO * BATCH * 32 * 4        # (b, 32) fp32 each way
        assert by["micro-batches held at peak"][0] == (MICRO if schedule == "gpipe" else 2 - stage)
        for held in ("params held", "grads held", "optimizer held"):
            predicted, measured = by[held]
            assert 0 <= measured - predicted < 3 * 2 * 4 * 8, (held, predicted, measured)
    assert seen == set(ref_weights)


def _misuse(group, case: str):
    from ringzero.parallel import AdamConfig, wrap
    x = torch.randn(2, 8)
    try:
        if case == "optimizer":
            wrap(_mlp(), optimizer=torch.optim.Adam(_mlp().parameters()), group=group)
        elif case == "tp":
            wrap(_mlp(), optimizer=AdamConfig(), group=group, tp=2)
        elif case.startswith("pp"):
            split, strategy = {"pp-name": (["9"], "dp"), "pp-ranks": (3, "dp"), "pp-zero2": (["2"], "zero2"),
                               "pp-backward": (["2"], "dp")}[case]
            engine = wrap(_mlp(), strategy=strategy, optimizer=AdamConfig(), group=group, pp_split=split,
                          microbatches=2, loss_fn=_loss_y)
            engine.backward(_loss(x, x))
        else:
            engine = wrap(_mlp(), strategy="zero2", optimizer=AdamConfig(), group=group)
            if case == "step":
                engine.step()
            else:
                engine.backward(_loss(engine(x), x))
                engine.backward(_loss(engine(x), x))
    except (TypeError, ValueError, RuntimeError) as e:
        return type(e).__name__, str(e)
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case, kind, words", [
    ("optimizer", "TypeError", "optimizer must be a ringzero.parallel.optimizer.AdamConfig"),
    ("tp", "ValueError", "tp > 1 and tp_plan go together"),
    ("step", "RuntimeError", "step() after 0 of the 1 backward() calls"),
    ("twice", "RuntimeError", "backward() called 2 times without step()"),
    ("pp-name", "ValueError", "no child named '9'; children: 0, 1, 2, 3, 4"),
    ("pp-ranks", "ValueError", "pp_split makes 3 stages, which do not divide the 2 ranks"),
    ("pp-zero2", "ValueError", "ringzero takes dp or zero1 with pp_split"),
    ("pp-backward", "RuntimeError", "a pipeline computes its loss on the last stage: call step(x, target=y)"),
])
def test_misuse_is_one_clear_error(pool, case, kind, words):
    for got in pool.run(_misuse, case, world=2):
        assert got is not None and got[0] == kind and words in got[1] and "\n" not in got[1], got


EXAMPLES = [ROOT / "examples" / "zero2_mlp.py", ROOT / "examples" / "pp_mlp.py"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_docs_show_the_example_as_it_is(example):
    page = (ROOT / "docs" / "library.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert example.read_text() in blocks


# Each example runs under one launcher and each launcher runs one example (the pairs cost ~9 s each
# on 2 cores: `python -m pytest tests/test_wrap.py -k example --durations=0`); the zero2 example is the
# docs' first, the pipeline the one torchrun's per-process environment matters most to.
LAUNCHES = [("ringzero.launch", e) for e in EXAMPLES if e.name == "zero2_mlp.py"] + \
           [("torchrun", e) for e in EXAMPLES if e.name == "pp_mlp.py"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher, example", LAUNCHES, ids=lambda v: getattr(v, "name", v))
def test_the_example_trains_locally_and_under_torchrun(launcher, example):
    cmd = [sys.executable, str(example)] if launcher == "ringzero.launch" else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(example)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [l for l in done.stdout.splitlines() if l.startswith("rank ")]
    assert len(lines) == 2, done.stdout
    learned = [l for l in lines if " at the first step" in l]
    assert len(learned) == (1 if example.name == "pp_mlp.py" else 2), lines     # a pipeline: its last stage
    for line in learned:
        first, last = map(float, re.findall(r"([\d.]+) at the", line))
        assert last < 0.1 * first, line                                    # it learned
    assert len(re.findall(r"^  bytes sent per step: planner", done.stdout, re.M)) == 2
    for planner, measured in re.findall(r"bytes \w+ per step: planner ([\d,]+) B, measured ([\d,]+) B", done.stdout):
        assert planner == measured
