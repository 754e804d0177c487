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

Under tensor parallelism without sequence parallelism a stage's output is the same on every tp rank,
so each tp rank sends only its 1/t slice and the next stage all-gathers it over tp (Megatron's
scatter/gather, Narayanan et al. 2021 §4.1); the gradient of the gathered tensor is the same on
every tp rank too (the block opens with LayerNorm and a column-parallel copy whose backward sums over
tp), so its slice is what goes back. With sequence parallelism the output is already a (b, s/t, h)
shard per rank and travels as it is.
"""

from __future__ import annotations

import torch
from torch import nn

from ringzero import comm
from ringzero.plan.pipeline.layout import chunk_layers, stage_chunks


class _GatherSlices(torch.autograd.Function):
    """(n/t,) slice per tp rank -> the whole (n,) tensor; backward: this rank's slice of the
    (identical on every tp rank) gradient."""

    @staticmethod
    def forward(ctx, piece: torch.Tensor, group, t: int, r: int, algorithm: str) -> torch.Tensor:
        ctx.t, ctx.r = t, r
        out = piece.new_empty(piece.numel() * t)
        comm.all_gather_into_tensor(out, piece, group=group, algorithm=algorithm)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.reshape(-1).chunk(ctx.t)[ctx.r].clone(), None, None, None, None


class StageBoundary:
    """What every stage of a pipeline does at its boundaries: which of its chunks are the model's
    first and last, and what crosses to the next stage (see the module doc). A subclass sets
    `chunks` (the global chunk of each local one) and `last_chunk`, and defines `forward(c, x,
    targets)` and `sync_tied_grads(strategy)`."""

    chunks: list[int]
    last_chunk: int

    def __init__(self, topology, scatter_gather: bool, tp_algorithm: str = "auto") -> None:
        self.topology, self.scatter_gather, self.tp_algorithm = topology, scatter_gather, tp_algorithm

    def is_first(self, c: int) -> bool:
        return self.chunks[c] == 0

    def is_last(self, c: int) -> bool:
        return self.chunks[c] == self.last_chunk

    def outgoing(self, t: torch.Tensor) -> torch.Tensor:
        """What this tp rank sends of activation or gradient `t`: its slice under scatter/gather."""
        flat = t.detach().reshape(-1)
        if self.scatter_gather:
            flat = flat.chunk(self.topology.tp)[self.topology.tp_rank]
        return flat.contiguous()

    def incoming_numel(self, numel: int) -> int:
        return numel // self.topology.tp if self.scatter_gather else numel

    def gather_activation(self, piece: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The chunk's input from the received `piece` (a leaf whose .grad is what goes back)."""
        if not self.scatter_gather:
            return piece.view(shape)
        topo = self.topology
        return _GatherSlices.apply(piece, topo.tp_group, topo.tp, topo.tp_rank, self.tp_algorithm).view(shape)

    def gather_grad(self, piece: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A received output gradient, whole (all-gathered over tp under scatter/gather)."""
        if not self.scatter_gather:
            return piece.view(shape)
        topo = self.topology
        out = piece.new_empty(piece.numel() * topo.tp)
        comm.all_gather_into_tensor(out, piece, group=topo.tp_group, algorithm=self.tp_algorithm)
        return out.view(shape)


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
    (`pipeline_sequential.SequentialStages`; `loss_fn(output, targets)` on the last stage)."""
    if cut_at is None:
        return PipelineStages(model, topology, virtual_stages, sequence_parallel, tp_algorithm)
    from ringzero.parallel.pp.sequential import SequentialStages
    return SequentialStages(model, topology, cut_at, loss_fn)
