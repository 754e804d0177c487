"""torch's own pipeline parallelism on ringzero's GPT: the peer ringzero's pipeline engine is timed against.

Every rank builds the whole GPT from the config's seed, cuts its blocks into pp·v contiguous chunks
exactly as ringzero's engine does (`plan.pipeline.layout.chunk_layers`: balanced by FLOPs, the tied
head's matmul counted with the last chunk), and keeps the chunks g = rank, rank + pp, ... (global
chunk g lives on pipeline rank g % pp, as in ringzero and in `torch.distributed.pipelining`).
Chunk 0 also runs the embedding (wte, wpe, dropout); the last chunk runs the final LayerNorm and the tied head, and the schedule's `loss_fn` (the GPT's own
`CrossEntropy`) turns its logits into the loss. Each chunk becomes a `PipelineStage`, driven by
`ScheduleGPipe`, `Schedule1F1B` or `ScheduleInterleaved1F1B` with one micro-batch of
`cfg.training.micro_batch` sequences per `cfg.training.grad_accum`.

Tied embeddings as in Megatron-LM (Shoeybi et al. 2019; Narayanan et al. 2021): the first and the
last pipeline rank each hold a copy of wte, equal at the start (same seed). After backward the two
ranks add their wte gradients, so both copies get the gradient of the tied weight and, through
identical AdamW updates, stay equal. On one rank (pp = 1) the two chunks share the one parameter.

The update is ringzero's: gradients of the mean loss over the step's micro-batches, clipped to
`cfg.optim.clip` by the global norm (squares summed over the pipeline ranks, the tied weight counted
once), then `torch.optim.AdamW` with `cfg.lr_at(step)`, betas, eps and weight decay, in fp32. So a
run's losses equal those of the plain GPT trained on the same batches, within fp32 rounding.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.pipeline import layout as pipeline_layout
from ringzero.run.config import TrainConfig
from ringzero.train.data import ByteData, load_bytes
from ringzero.train.model import GPT

CPU = torch.device("cpu")


class Chunk(nn.Module):
    """Blocks `layers` of `gpt`, with the embedding in front if `first` and the final norm and
    tied head behind if `last`: (b, s) ids or (b, s, h) activations -> (b, s, h) or logits (b, s, V)."""

    def __init__(self, gpt: GPT, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        if first or last:
            self.wte = gpt.wte
        if first:
            self.wpe, self.drop = gpt.wpe, gpt.drop
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in layers)
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.size(1), device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))                          # (b, s) -> (b, s, h)
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x), self.wte.weight)                       # (b, s, h) -> (b, s, V)
        return x


def _check(cfg: TrainConfig, pp: int, schedule: str, virtual_stages: int) -> None:
    """ValueError for what this peer does not run (it is pipeline parallelism alone, in fp32)."""
    pipeline.check(pp, cfg.shape.layers, cfg.training.grad_accum, schedule, virtual_stages)
    flat = cfg.flat()
    other = [f"{k}={flat[k]!r}" for k, ok in (("tp", cfg.parallel.tp == 1), ("dp", cfg.parallel.dp in (None, 1)),
             ("precision", cfg.optim.precision == "fp32"), ("recompute", cfg.training.recompute == "none")) if not ok]
    if other:
        raise ValueError(f"the torch pipeline peer runs pp alone in fp32 without recomputation; "
                         f"got {', '.join(other)}")


class TorchPipeline:
    """This rank's stages of `cfg`'s GPT under torch's `schedule` over the ranks of `group` (pp =
    its size), and their optimizer. `step(i)` trains on step i's batch and returns the step's loss
    on the rank of the last chunk, None on the others."""

    def __init__(self, cfg: TrainConfig, group, schedule: str, virtual_stages: int = 1,
                 data: ByteData | None = None) -> None:
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                  ScheduleInterleaved1F1B)
        self.pp, self.rank = dist.get_world_size(group), dist.get_rank(group)
        _check(cfg, self.pp, schedule, virtual_stages)
        self.cfg, self.group = cfg, group
        self.data = data or ByteData(load_bytes(cfg.training.data, cfg.training.max_bytes), cfg.shape.seq, seed=cfg.training.seed)
        torch.manual_seed(cfg.training.seed)
        gpt = GPT(cfg.shape, attention=cfg.model.attention, dropout=cfg.model.dropout)
        n = self.pp * virtual_stages
        cuts = pipeline_layout.chunk_layers(cfg.shape, n)
        mine = pipeline_layout.stage_chunks(self.rank, self.pp, virtual_stages)
        self.chunks = [Chunk(gpt, cuts[g], g == 0, g == n - 1) for g in mine]
        stages = [PipelineStage(c, g, n, CPU, group=group) for c, g in zip(self.chunks, mine)]
        # Gradients are summed over the micro-batches and divided once here: torch's own scaling
        # divides per stage, twice for a weight two local stages share (wte when pp = 1).
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}[schedule]
        self.schedule = kind(stages if schedule == "interleaved" else stages[0], cfg.training.grad_accum,
                             loss_fn=gpt.loss, scale_grads=False)
        self.params = list({id(p): p for c in self.chunks for p in c.parameters()}.values())
        self.wte = gpt.wte.weight
        self.opt = torch.optim.AdamW(self.params, lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps,
                                     weight_decay=cfg.optim.weight_decay)
        self.holds_first, self.holds_last = self.rank == 0, self.rank == self.pp - 1

    def step(self, i: int) -> float | None:
        c = self.cfg
        x, y = self.data.batch("train", i, c.training.micro_batch * c.training.grad_accum)
        self.opt.zero_grad(set_to_none=True)
        losses: list = []
        args = (x,) if self.holds_first else ()
        kw = dict(target=y, losses=losses) if self.holds_last else {}
        self.schedule.step(*args, return_outputs=False, **kw)
        grads = [p.grad for p in self.params if p.grad is not None]
        torch._foreach_div_(grads, c.training.grad_accum)                       # sum over micro-batches -> mean
        self._tie()
        if c.optim.clip is not None:
            self._clip(c.optim.clip)
        for g in self.opt.param_groups:
            g["lr"] = c.lr_at(i)
        self.opt.step()
        return float(torch.stack(losses).detach().mean()) if self.holds_last else None

    def _tie(self) -> None:
        """The first and last ranks swap their wte gradients and each adds the other's (both sums
        are g_first + g_last, bit for bit: fp32 addition commutes)."""
        if self.pp == 1 or not (self.holds_first or self.holds_last):
            return
        mine = self.wte.grad
        theirs = torch.empty_like(mine)
        peer = self.pp - 1 if self.holds_first else 0
        ops = [dist.P2POp(dist.isend, mine, group=self.group, group_peer=peer),
               dist.P2POp(dist.irecv, theirs, group=self.group, group_peer=peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        mine.add_(theirs)

    def _clip(self, clip: float) -> None:
        """`clip_grad_norm_` over the whole model: squares summed over the pipeline ranks, the last
        rank's copy of wte left out so the tied weight counts once."""
        grads = [p.grad for p in self.params if p.grad is not None]
        counted = [p.grad for p in self.params
                   if p.grad is not None and not (p is self.wte and self.holds_last and self.pp > 1)]
        sq = torch.stack([g.square().sum() for g in counted]).sum() if counted else torch.zeros(())
        dist.all_reduce(sq, group=self.group)
        coef = clip / (float(sq.sqrt()) + 1e-6)
        if coef < 1:
            torch._foreach_mul_(grads, coef)


class Variant:
    """`TorchPipeline` as one of `bench.train_ranks`' variants: a step per call, its loss (None but
    on the last rank) and no phases (torch's schedule runs a whole step in one call); `states()`:
    weights, gradients and AdamW's state held."""

    def __init__(self, cfg: TrainConfig, group, data: ByteData) -> None:
        self.peer = TorchPipeline(cfg, group, cfg.parallel.schedule, cfg.parallel.virtual_stages, data)

    def step(self, i: int, measure: bool = False) -> tuple[float | None, dict]:
        return self.peer.step(i), {}

    def states(self) -> dict:
        def nbytes(ts) -> int:
            return sum(t.numel() * t.element_size() for t in ts if t is not None)
        p = self.peer
        return {"params": nbytes(p.params), "grads": nbytes(q.grad for q in p.params), "transient_peak": 0,
                "optimizer": nbytes(t for s in p.opt.state.values() for t in s.values() if torch.is_tensor(t))}

    def close(self) -> None:
        pass


def train(group, cfg: TrainConfig, schedule: str, virtual_stages: int = 1) -> dict:
    """Runs on every rank of `group` (pp = its size): `cfg.training.steps` steps of `TorchPipeline`, each
    timed by `time.perf_counter` after a barrier. Returns {"times": [s per step, this rank's],
    "losses": [mean loss over the step's micro-batches]}, the losses sent from the last rank so
    every rank returns them."""
    peer = TorchPipeline(cfg, group, schedule, virtual_stages)
    times, losses = [], []
    for i in range(cfg.training.steps):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        loss = peer.step(i)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    out = torch.tensor([x if x is not None else 0.0 for x in losses], dtype=torch.float64)
    dist.broadcast(out, group=group, group_src=peer.pp - 1)
    return {"times": times, "losses": out.tolist()}
