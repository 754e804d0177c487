"""The vocabulary split over tp ranks: embedding, tied head and cross-entropy (Shoeybi et al. 2019 §3).

Rank r holds rows [r·V'/t, (r+1)·V'/t) of the token embedding, V' the vocabulary padded to a
multiple of t (Megatron-LM's `_vocab_size_with_padding`; Megatron also rounds to a multiple of 128·t,
`make_vocab_size_divisible_by`, which `divisible_by` offers). Padding rows are zero and are never
looked up; their logits are -inf, so they take no probability and the loss and every gradient are
those of the unpadded model.

- `VocabParallelEmbedding`: each rank looks up the tokens it owns (zeros for the others), and one
  all-reduce (g) of the (b, s, h) output sums the parts. No communication in backward.
- `VocabParallelHead`: logits of this rank's V'/t rows of the tied weight, (b, s, h) -> (b, s, V'/t).
  Its input is replicated, so f (all-reduce of the input's gradient in backward) stands before it;
  under sequence parallelism its input is a sequence shard, all-gathered along the sequence first
  (backward: reduce-scatter), as Megatron's output layer does, so every rank has the whole sequence
  and the loss is the same on every tp rank.
- `VocabParallelCrossEntropy`: Megatron's `_VocabParallelCrossEntropy` (the full logits are never
  gathered): three all-reduces of one float per token in forward (the max, for a stable exp; the
  target's logit, which only its owner holds; the sum of exps) and none in backward, where each rank
  writes softmax - one_hot on its own columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ringzero import comm
from ringzero.plan.strategies.tensor_parallel import padded_vocab  # noqa: F401  (re-exported: the split's rows)
from ringzero.parallel.tp.ops import copy_to_tp, gather_from_seq, group_size, reduce_from_tp
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import TP


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + weight.size(0)) of an embedding; output summed over the tp group."""

    def __init__(self, weight: torch.Tensor, start: int, group, algorithm: str = "auto") -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.start, self.group, self.algorithm = start, group, algorithm

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        local = idx - self.start
        foreign = (local < 0) | (local >= self.weight.size(0))          # (b, s): tokens another rank owns
        out = F.embedding(local.masked_fill(foreign, 0), self.weight)   # (b, s, h)
        return reduce_from_tp(out.masked_fill(foreign.unsqueeze(-1), 0.0), self.group, self.algorithm)


class VocabParallelHead(nn.Module):
    """Tied head on a vocabulary shard: (b, s, h) -> (b, s, V'/t), -inf on padding columns."""

    def __init__(self, start: int, rows: int, vocab: int, group, *, sequence_parallel: bool = False,
                 algorithm: str = "auto") -> None:
        super().__init__()
        self.group, self.sequence_parallel, self.algorithm = group, sequence_parallel, algorithm
        pad = torch.arange(start, start + rows) >= vocab                 # (V'/t,): padding columns
        self.register_buffer("pad", pad if pad.any() else None, persistent=False)

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            x = gather_from_seq(x, self.group, self.algorithm)          # (b, s/t, h) -> (b, s, h)
        else:
            x = copy_to_tp(x, self.group, self.algorithm)
        logits = F.linear(x, weight)                                     # (b, s, h) @ (V'/t, h)ᵀ
        return logits if self.pad is None else logits.masked_fill(self.pad, float("-inf"))


@tagged(TP)
def _all_reduce(t: torch.Tensor, op: str, group, algorithm: str) -> None:
    if group_size(group) > 1:
        comm.all_reduce(t, op=op, group=group, algorithm=algorithm)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy of logits split by vocabulary: (N, V'/t), targets (N,) -> (N,)."""

    @staticmethod
    def forward(ctx, logits, targets, start, group, algorithm):
        ctx.dtype = logits.dtype
        logits = logits.float()
        peak = logits.max(dim=-1).values                                         # (N,)
        _all_reduce(peak, "max", group, algorithm)
        shifted = logits - peak.unsqueeze(-1)
        local = targets - start
        foreign = (local < 0) | (local >= logits.size(-1))                       # (N,): target elsewhere
        local = local.masked_fill(foreign, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(foreign, 0.0)
        _all_reduce(target_logit, "sum", group, algorithm)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        _all_reduce(sum_exp, "sum", group, algorithm)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, foreign)  # softmax on my columns
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad):
        softmax, local, foreign = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.size(0), device=g.device)
        g[rows, local] -= (~foreign).to(g.dtype)                                 # softmax - one_hot
        return (g * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None, None


class VocabParallelCrossEntropy(nn.Module):
    """Mean cross-entropy of vocabulary-split logits (b, s, V'/t) against targets (b, s)."""

    def __init__(self, start: int, group, algorithm: str = "auto") -> None:
        super().__init__()
        self.start, self.group, self.algorithm = start, group, algorithm

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.size(-1))
        return _VocabParallelCE.apply(flat, targets.reshape(-1), self.start, self.group, self.algorithm).mean()
