"""Tensor parallelism (Shoeybi et al. 2019, Megatron-LM §3) and sequence parallelism (Korthikanti et
al. 2022 §4.2.2), applied to a built model from outside: `apply_tensor_parallel(model, topology)`.

A transformer layer has two tensor-parallel regions, attention and MLP. Each opens with a
column-parallel linear (qkv, split by heads: rank r keeps the rows of its a/t heads in each of q, k
and v; the MLP's fc: ffn/t output columns) whose input is replicated, and closes with a row-parallel
linear (attention's and the MLP's output projections: the matching input rows) whose partial outputs
are summed over the tp group, its bias added once, after the sum. So one layer's forward issues two
all-reduces of (b, s, h) (g after each region) and its backward two more (f before each region):
four all-reduces of b·s·h elements per layer. The vocabulary is split too (`vocab_parallel`).

Sequence parallelism shards the activations between the regions by sequence, (b, s/t, h) per rank,
so the LayerNorms, dropouts and residual adds each work on s/t tokens: an all-gather along the
sequence before each column-parallel linear and a reduce-scatter after each row-parallel one replace
f and g (backward: reduce-scatter and all-gather), the same bytes. The embedding output, summed over
the vocabulary shards as without SP, is cut to this rank's shard (`scatter_to_seq`, backward
all-gather); the final LayerNorm runs on the shard and the head all-gathers the sequence, as
Megatron's output layer does, so the loss is the same on every tp rank. Unlike Megatron, which saves
only the shard and all-gathers it again in backward, autograd keeps the gathered (b, s, h) input of
each column-parallel linear for its weight gradient (no extra all-gather, more memory).

Parameters are marked as Megatron marks them (`tensor_model_parallel`, `partition_dim`,
`partition_stride`, `sequence_parallel`), and `tp_grads.tp_param_kind(p)` gives one of `TPParamKind`:
SHARDED (a slice per tp rank, its gradient complete), REPLICATED (the same value and gradient on
every tp rank) or PARTIAL_GRAD (replicated, but under SP each rank's gradient covers its own tokens:
the LayerNorms and the row-parallel biases; the caller sums them over the tp group: per parameter
with `tp_grads.sync_sequence_parallel_grads`, or in a strategy's flat buckets with
`tp_grads.TensorParallelGrads`). The position embedding is added before the cut to shards, so its
gradient is complete (REPLICATED).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch

import torch
import torch.nn.functional as F
from torch import nn

from ringzero.parallel.tp.rng import RNGFork, RNGTracker
from ringzero.parallel.tp.grads import TPParamKind
from ringzero.parallel.tp.ops import copy_to_tp, gather_from_seq, reduce_from_tp, reduce_scatter_to_seq, scatter_to_seq
from ringzero.parallel.tp.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding, VocabParallelHead, padded_vocab


def _mark(p: nn.Parameter, kind: TPParamKind, dim: int = 0, stride: int = 1,
          full_shape: tuple[int, ...] | None = None) -> None:
    p.tp_kind = kind
    p.tensor_model_parallel = kind is TPParamKind.SHARDED          # Megatron's attribute names
    p.sequence_parallel = kind is TPParamKind.PARTIAL_GRAD
    if kind is TPParamKind.SHARDED:
        p.partition_dim, p.partition_stride, p.tp_full_shape = dim, stride, full_shape


def _shard(full: torch.Tensor, dim: int, t: int, r: int, stride: int = 1) -> torch.Tensor:
    """Rank r's slice along `dim`: of each of `stride` stacked blocks (q, k, v), its 1/t."""
    return torch.cat([block.chunk(t, dim)[r] for block in full.chunk(stride, dim)], dim).clone()


@dataclass(frozen=True)
class _Ctx:
    group: object
    t: int
    r: int
    sequence_parallel: bool
    algorithm: str


class ColumnParallelLinear(nn.Module):
    """y = x Aᵣᵀ + bᵣ on this rank's output rows; x replicated (f before) or gathered along the sequence."""

    def __init__(self, linear: nn.Linear, ctx: _Ctx, stride: int = 1) -> None:
        super().__init__()
        self.ctx, full = ctx, tuple(linear.weight.shape)
        self.weight = nn.Parameter(_shard(linear.weight.detach(), 0, ctx.t, ctx.r, stride))
        _mark(self.weight, TPParamKind.SHARDED, 0, stride, full)
        self.bias = None
        if linear.bias is not None:
            self.bias = nn.Parameter(_shard(linear.bias.detach(), 0, ctx.t, ctx.r, stride))
            _mark(self.bias, TPParamKind.SHARDED, 0, stride, (full[0],))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.ctx
        x = gather_from_seq(x, c.group, c.algorithm) if c.sequence_parallel else copy_to_tp(x, c.group, c.algorithm)
        return F.linear(x, self.weight, self.bias)                      # (b, s, in) -> (b, s, out/t)


class RowParallelLinear(nn.Module):
    """y = Σᵣ xᵣ Aᵣᵀ + b: this rank's input columns, outputs summed (or reduce-scattered), bias once."""

    def __init__(self, linear: nn.Linear, ctx: _Ctx, stride: int = 1) -> None:
        super().__init__()
        self.ctx = ctx
        self.weight = nn.Parameter(_shard(linear.weight.detach(), 1, ctx.t, ctx.r, stride))
        _mark(self.weight, TPParamKind.SHARDED, 1, stride, tuple(linear.weight.shape))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        if self.bias is not None:
            _mark(self.bias, TPParamKind.PARTIAL_GRAD if ctx.sequence_parallel else TPParamKind.REPLICATED)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.ctx
        y = F.linear(x, self.weight)                                    # (b, s, in/t) -> (b, s, out) partial
        y = reduce_scatter_to_seq(y, c.group, c.algorithm) if c.sequence_parallel else \
            reduce_from_tp(y, c.group, c.algorithm)
        return y if self.bias is None else y + self.bias


class SequenceScatter(nn.Module):
    """This rank's sequence shard of a replicated (b, s, h) (backward: all-gather)."""

    def __init__(self, ctx: _Ctx) -> None:
        super().__init__()
        self.ctx = ctx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scatter_to_seq(x, self.ctx.group, self.ctx.algorithm)


STYLES = {"colwise": ColumnParallelLinear, "rowwise": RowParallelLinear}
"""Plan styles, as torch's `ColwiseParallel` (input replicated, output sharded by features) and
`RowwiseParallel` (input sharded by features, output all-reduced)."""

GPT_PLAN = {"blocks.*.attn.qkv": ("colwise", 3), "blocks.*.attn.proj": ("rowwise", 1),
            "blocks.*.mlp.fc": ("colwise", 1), "blocks.*.mlp.proj": ("rowwise", 1)}
"""ringzero's GPT: pattern -> (style, stride); qkv's stride 3 splits q, k and v each by heads."""


@dataclass(frozen=True)
class TPLayout:
    """What `apply_tensor_parallel` did on this rank."""

    tp: int
    tp_rank: int
    sequence_parallel: bool
    styles: dict[str, str] = field(default_factory=dict)
    """Module name -> "colwise", "rowwise" or "vocab" (the embedding, head and loss)."""
    vocab: int | None = None
    """The model's vocabulary (None: a model without a vocabulary-parallel embedding)."""
    padded_vocab: int | None = None
    """The vocabulary padded to a multiple of tp; each rank holds padded_vocab / tp rows."""
    rng: RNGTracker | None = None
    """The model-parallel dropout state (seed + 2718 + tp_rank): wired into the GPT's sharded regions;
    for a plan, the caller's to fork around its own sharded dropouts."""

    @property
    def vocab_padding(self) -> int:
        """Rows added to the embedding so that tp divides it (zero, never looked up)."""
        return 0 if self.vocab is None else self.padded_vocab - self.vocab


def _linears(model: nn.Module, spec: dict[str, tuple[str, int]], t: int) -> dict[str, tuple[str, int]]:
    """Module name -> (style, stride) for every module a pattern of `spec` matches, all checked before
    any is split."""
    found = {}
    for pattern, (style, stride) in spec.items():
        if style not in STYLES:
            raise ValueError(f"plan[{pattern!r}] = {style!r}; allowed: {', '.join(STYLES)}")
        names = [n for n, _ in model.named_modules() if n and fnmatch(n, pattern)]
        if not names:
            raise ValueError(f"plan pattern {pattern!r} matches no module of {type(model).__name__}")
        for n in names:
            mod = model.get_submodule(n)
            if not isinstance(mod, nn.Linear):
                raise ValueError(f"plan pattern {pattern!r} matches {n}, a {type(mod).__name__}; "
                                 "only nn.Linear can be split")
            side, width = ("output", mod.out_features) if style == "colwise" else ("input", mod.in_features)
            if width % (t * stride):
                raise ValueError(f"tp={t} does not divide the {width} {side} features of {n}")
            found[n] = (style, stride)
    return found


def _split_linears(model: nn.Module, found: dict[str, tuple[str, int]], ctx: _Ctx) -> None:
    for name, (style, stride) in found.items():
        parent, _, leaf = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        setattr(holder, leaf, STYLES[style](getattr(holder, leaf), ctx, stride))


def _check_gpt(model, t: int, sequence_parallel: bool) -> None:
    m = model.shape
    if m.heads % t:
        raise ValueError(f"tp={t} must divide the {m.heads} attention heads")
    if m.ffn_dim % t:
        raise ValueError(f"tp={t} must divide the MLP width ffn={m.ffn_dim}")
    if sequence_parallel and m.seq % t:
        raise ValueError(f"sequence parallelism needs the sequence length {m.seq} divisible by tp={t}")


def _vocab_parallel(model, ctx: _Ctx, divisible_by: int) -> int:
    """Swap the embedding, head and loss for their vocabulary-parallel forms; the padded vocabulary."""
    vocab, h = model.wte.weight.shape
    padded = padded_vocab(vocab, ctx.t, divisible_by)
    rows, start = padded // ctx.t, ctx.r * (padded // ctx.t)
    full = torch.cat([model.wte.weight.detach(), model.wte.weight.new_zeros(padded - vocab, h)])
    model.wte = VocabParallelEmbedding(full[start:start + rows].clone(), start, ctx.group, ctx.algorithm)
    _mark(model.wte.weight, TPParamKind.SHARDED, 0, 1, (vocab, h))
    model.head = VocabParallelHead(start, rows, vocab, ctx.group, sequence_parallel=ctx.sequence_parallel,
                                   algorithm=ctx.algorithm)
    model.loss = VocabParallelCrossEntropy(start, ctx.group, ctx.algorithm)
    return padded


def _dropouts(model, ctx: _Ctx, tracker: RNGTracker) -> None:
    """Sharded regions draw dropout masks from the tracker: the attention core always, and under SP
    every dropout between regions (sequence shards); the embedding output is cut to its shard first."""
    for block in model.blocks:
        block.attn.core = RNGFork(block.attn.core, tracker)
        if ctx.sequence_parallel:
            block.attn.drop = RNGFork(block.attn.drop, tracker)
            block.mlp.drop = RNGFork(block.mlp.drop, tracker)
    if ctx.sequence_parallel:
        model.drop = nn.Sequential(SequenceScatter(ctx), RNGFork(model.drop, tracker))


def apply_tensor_parallel(model: nn.Module, topology, plan: dict[str, str] | None = None, *,
                          sequence_parallel: bool = False, algorithm: str = "auto", seed: int = 0,
                          vocab_divisible_by: int = 1) -> TPLayout:
    """Split `model` over `topology`'s tp group, in place, and return what was done.

    plan None: ringzero's GPT (`train.model.GPT`): qkv and fc column-parallel, the two output
    projections row-parallel, the embedding, tied head and loss vocabulary-parallel, dropout RNG as
    Megatron's (module doc). Otherwise `plan` maps module-name patterns (fnmatch, e.g. "layers.*.fc1")
    to "colwise" or "rowwise" (nn.Linear only; a rowwise layer's input must be the feature shard a
    colwise layer produced). Every rank passes the same, identically initialised model: the full
    weights are sliced, so the split model computes what the whole one does. `sequence_parallel`
    needs plan None; `algorithm` names the collectives' algorithm ("auto", "torch", "ring", ...);
    `seed` is the base of the dropout tracker; `vocab_divisible_by` rounds the padded vocabulary to a
    multiple of it·tp (Megatron: 128). Raises ValueError when tp does not divide the heads, the MLP
    width or (under SP) the sequence, or for a plan pattern that matches no module or a non-Linear.
    tp = 1 leaves the model as it is.
    """
    t, r = topology.tp, topology.tp_rank
    if plan is not None and sequence_parallel:
        raise ValueError("sequence_parallel needs ringzero's GPT (plan=None): a plan names no norms or dropouts")
    if plan is None and not all(hasattr(model, a) for a in ("shape", "wte", "blocks", "head", "loss")):
        raise ValueError(f"plan=None splits ringzero's GPT; give a plan for a {type(model).__name__}")
    tracker = RNGTracker.model_parallel(seed, r)
    if t == 1:
        return TPLayout(tp=1, tp_rank=0, sequence_parallel=sequence_parallel, rng=tracker)
    ctx = _Ctx(topology.tp_group, t, r, sequence_parallel, algorithm)
    if plan is not None:
        found = _linears(model, {k: (v, 1) for k, v in plan.items()}, t)
        _split_linears(model, found, ctx)
        _mark_rest(model, sequence_parallel)
        return TPLayout(tp=t, tp_rank=r, sequence_parallel=False, rng=tracker,
                        styles={n: s for n, (s, _) in found.items()})
    _check_gpt(model, t, sequence_parallel)
    found = _linears(model, GPT_PLAN, t)
    _split_linears(model, found, ctx)
    vocab = model.wte.weight.size(0)
    padded = _vocab_parallel(model, ctx, vocab_divisible_by)
    _dropouts(model, ctx, tracker)
    _mark_rest(model, sequence_parallel)
    styles = {n: s for n, (s, _) in found.items()} | {n: "vocab" for n in ("wte", "head", "loss")}
    return TPLayout(tp=t, tp_rank=r, sequence_parallel=sequence_parallel, styles=styles, vocab=vocab,
                    padded_vocab=padded, rng=tracker)


def split_block(block: nn.Module, topology, *, sequence_parallel: bool = False, algorithm: str = "auto") -> None:
    """Split one block of ringzero's GPT over `topology`'s tp group, in place, as
    `apply_tensor_parallel` splits each of the model's: its two column- and two row-parallel linears
    with their collectives (a block alone: what one layer of a tensor-parallel step computes and
    sends, for a probe to time). Its input is (b, s/t, h) under sequence parallelism, else (b, s, h)."""
    spec = {name.removeprefix("blocks.*."): style for name, style in GPT_PLAN.items()}
    ctx = _Ctx(topology.tp_group, topology.tp, topology.tp_rank, sequence_parallel, algorithm)
    _split_linears(block, _linears(block, spec, topology.tp), ctx)


def _mark_rest(model: nn.Module, sequence_parallel: bool) -> None:
    """Mark what the split left unmarked: replicated, except LayerNorms on sequence shards."""
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            if not hasattr(p, "tp_kind"):
                partial = sequence_parallel and isinstance(mod, nn.LayerNorm)
                _mark(p, TPParamKind.PARTIAL_GRAD if partial else TPParamKind.REPLICATED)
