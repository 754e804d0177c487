"""Pipeline parallelism's cut of ringzero's GPT into stages (Huang et al. 2019; Narayanan et al. 2021).

`apply_pipeline(model, topology, virtual_stages)` keeps on this rank only what its stage runs: the
blocks of its model chunks (`plan.pipeline.layout.chunk_layers`: p·v chunks balanced by cost; stage i
holds chunks i, i + p, ...), the embeddings on the first stage, the final norm, head and loss on the
last. Blocks stay under their own names (`blocks.5` is block 5 on whichever stage holds it), so
parameter names, checkpoints and the single-rank model agree.

Tied embeddings: the last stage keeps the token embedding too (the head multiplies by its weight);
both copies start equal (every rank builds the model from one seed) and `sync_tied_grads` sums their
gradients over the two stages after backward, as Megatron-LM's embedding group does, so they stay
equal. The copy on the last stage is marked `pipeline_tied_copy`: the global gradient norm counts
the weight once.

What crosses between stages, and its tensor-parallel scatter/gather, is `parallel.pp.boundary`'s.
"""

from __future__ import annotations

import torch
from torch import nn

from ringzero import comm
from ringzero.parallel.pp.boundary import StageBoundary
from ringzero.parallel.pp.sequential import SequentialStages
from ringzero.plan.pipeline.layout import chunk_layers, stage_chunks
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import EMBEDDING


class PipelineStages(StageBoundary):
    """This rank's model chunks of a GPT cut into `topology.pp` x `virtual_stages` chunks."""

    def __init__(self, model: nn.Module, topology, virtual_stages: int = 1, sequence_parallel: bool = False,
                 tp_algorithm: str = "auto") -> None:
        super().__init__(topology, topology.tp > 1 and not sequence_parallel, tp_algorithm)
        self.model, self.v = model, virtual_stages
        p, i = topology.pp, topology.pp_rank
        self.chunks = stage_chunks(i, p, virtual_stages)           # global chunk of each local chunk
        self.last_chunk = p * virtual_stages - 1
        ranges = chunk_layers(model.shape, p * virtual_stages)
        self.layers = [ranges[g] for g in self.chunks]
        keep = {str(k) for r in self.layers for k in r}
        model.blocks = nn.ModuleDict({str(k): b for k, b in enumerate(model.blocks) if str(k) in keep})
        first, last = 0 in self.chunks, self.last_chunk in self.chunks
        if not first:
            del model.wpe
            model.drop = nn.Identity()
        if not last:
            del model.ln_f
        if not (first or last):
            del model.wte
        if last and not first:
            model.wte.weight.pipeline_tied_copy = True

    def forward(self, c: int, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Local chunk `c` on `x`: token ids (b, s) on the first chunk, else its input activation;
        returns the activation it passes on, or on the last chunk the loss (with `targets`) or logits."""
        m = self.model
        if self.is_first(c):
            pos = torch.arange(x.size(1), device=x.device)
            x = m.drop(m.wte(x) + m.wpe(pos))                                       # (b, s, h)
        for k in self.layers[c]:
            x = m.blocks[str(k)](x)
        if not self.is_last(c):
            return x
        logits = m.head(m.ln_f(x), m.wte.weight)
        return logits if targets is None else m.loss(logits, targets)

    # -- tied embeddings --------------------------------------------------------------------------
    def tied_weight(self) -> nn.Parameter | None:
        """The token embedding when this rank is the first or the last stage of a pipeline."""
        if self.topology.pp == 1 or not hasattr(self.model, "wte"):
            return None
        return self.model.wte.weight

    @tagged(EMBEDDING)
    def sync_tied_grads(self, strategy) -> None:
        """Sum the token embedding's gradient over the first and last stage (in the strategy's
        unreduced gradient flat, before the dp reduction: the sums commute)."""
        w = self.tied_weight()
        if w is None:
            return
        grad = strategy.unreduced_grad(w)
        comm.all_reduce(grad, op="sum", group=self.topology.embedding_group, algorithm=self.tp_algorithm)


def apply_pipeline(model: nn.Module, topology, virtual_stages: int = 1, sequence_parallel: bool = False,
                   tp_algorithm: str = "auto", *, cut_at: list[str] | None = None, loss_fn=None) -> StageBoundary:
    """Cut `model` to this rank's stage, in place: a ringzero GPT (possibly tensor-parallel) by the
    planner's balance, or with `cut_at` any `nn.Sequential` before the children of those names
    (`parallel.pp.sequential.SequentialStages`; `loss_fn(output, targets)` on the last stage)."""
    if cut_at is None:
        return PipelineStages(model, topology, virtual_stages, sequence_parallel, tp_algorithm)
    return SequentialStages(model, topology, cut_at, loss_fn)
