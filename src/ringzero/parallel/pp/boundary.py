"""What every pipeline stage does at its boundaries, whatever it holds inside: which of its chunks
are the model's first and last, and what crosses to the next stage (Huang et al. 2019; Narayanan et
al. 2021). `pipeline.PipelineStages` (ringzero's GPT) and `sequential.SequentialStages` (any
`nn.Sequential`) build on it.

Under tensor parallelism without sequence parallelism a stage's output is the same on every tp rank,
so each tp rank sends only its 1/t slice and the next stage all-gathers it over tp (Megatron's
scatter/gather, Narayanan et al. 2021 §4.1); the gradient of the gathered tensor is the same on
every tp rank too (the block opens with LayerNorm and a column-parallel copy whose backward sums over
tp), so its slice is what goes back. With sequence parallelism the output is already a (b, s/t, h)
shard per rank and travels as it is.
"""

from __future__ import annotations

import torch

from ringzero import comm
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import TP


class _GatherSlices(torch.autograd.Function):
    """(n/t,) slice per tp rank -> the whole (n,) tensor; backward: this rank's slice of the
    (identical on every tp rank) gradient."""

    @staticmethod
    @tagged(TP)
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

    @tagged(TP)
    def gather_grad(self, piece: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A received output gradient, whole (all-gathered over tp under scatter/gather)."""
        if not self.scatter_gather:
            return piece.view(shape)
        topo = self.topology
        out = piece.new_empty(piece.numel() * topo.tp)
        comm.all_gather_into_tensor(out, piece, group=topo.tp_group, algorithm=self.tp_algorithm)
        return out.view(shape)
