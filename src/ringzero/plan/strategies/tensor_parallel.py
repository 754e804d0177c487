"""What one tensor-parallel rank holds and sends (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2).

Parameters. Megatron-LM splits the column-parallel linears (q, k, v by heads, the first MLP matrix and
their biases) and the row-parallel ones (attention output projection, second MLP matrix; their
biases stay whole, added after the reduction) over t ranks, and the token embedding by vocabulary
rows, the vocabulary padded to a multiple of t (Megatron's `_vocab_size_with_padding`); norms,
learned positions and the row-parallel biases are replicated on every tp rank.

Traffic per micro-batch of b·s tokens (elements of the activation dtype unless said):
- each layer: two all-reduces of b·s·h in forward (after the attention and MLP row-parallel linears,
  the g operator) and two in backward (before the column-parallel ones, the f operator); full
  recomputation runs the forward again in backward (`layer_collectives`: six as Megatron-LM replays
  it, five as torch's non-reentrant checkpoint does). Sequence parallelism turns each all-reduce
  into an all-gather before the column-parallel linear and a reduce-scatter after the row-parallel
  one, b·s·h each, and their conjugates in backward: the same bytes (Korthikanti et al. §4.2.2);
- the vocabulary-parallel embedding: one all-reduce of b·s·h in forward (with sequence parallelism
  the learned positions are added to the whole sequence, then each rank keeps its slice, whose
  gradient is all-gathered in backward); the tied head: its input's gradient all-reduced in backward
  (with sequence parallelism an all-gather of the input in forward and a reduce-scatter of its
  gradient);
- the vocabulary-parallel cross-entropy: three fp32 all-reduces of b·s (the row max, the sum of
  exponentials and the target logit), so that full logits are never gathered.
"""

from __future__ import annotations

import math

from ringzero.plan.model.shapes import ModelShape, attention_params, mlp_params, norm_params


def padded_vocab(vocab: int, tp: int, divisible_by: int = 1) -> int:
    """The vocabulary rounded up to a multiple of `divisible_by`·tp, so each rank holds an equal
    slice (Megatron rounds to 128·tp; ringzero's engine to tp)."""
    multiple = divisible_by * tp
    return math.ceil(vocab / multiple) * multiple


def replicated_params(m: ModelShape) -> int:
    """Parameters every tp rank holds whole: norms, learned positions, row-parallel biases."""
    per_layer = 2 * norm_params(m) + (2 * m.hidden if m.bias else 0)
    positions = m.seq * m.hidden if m.positions == "learned" else 0
    return m.layers * per_layer + norm_params(m) + positions


def local_params(m: ModelShape, tp: int) -> int:
    """Parameters one of `tp` ranks holds: its share of every split matrix, and the replicated rest
    (t = 1: the whole model)."""
    row_biases = 2 * m.hidden if m.bias else 0
    split = m.layers * (attention_params(m) + mlp_params(m) - row_biases)
    embedding = padded_vocab(m.vocab, tp) * m.hidden * (1 if m.tied else 2)
    return (split + embedding) // tp + replicated_params(m)


def partial_grad_params(m: ModelShape) -> int:
    """Parameters whose gradient is a partial sum per tp rank under sequence parallelism (each rank
    normalises and adds biases on its own slice of the sequence): the LayerNorms and the row-parallel
    biases, summed over the tp group once per step."""
    return (2 * m.layers + 1) * norm_params(m) + (2 * m.hidden * m.layers if m.bias else 0)


REPLAYS = ("whole", "early-stop")
"""How full recomputation re-runs a block in backward: "whole" re-runs all of it (Megatron-LM's
`CheckpointFunction`), "early-stop" stops once the last saved tensor is rebuilt (torch's
non-reentrant `checkpoint`, which ringzero's engine uses)."""


def layer_collectives(sequence_parallel: bool = False, recompute: str = "none",
                      replay: str = "early-stop") -> list[tuple[str, str, int]]:
    """(what, collective, calls) of one transformer layer per micro-batch, each of b·s·h elements.

    Without recomputation, and with selective recomputation (only the attention core, between the
    column- and row-parallel linears, is re-run: no tp collective), 4 all-reduces per layer. Full
    recomputation runs each block's forward again in backward. Re-run whole ("whole"), it repeats
    both reductions: 2 forward + 2 recomputed + 2 backward = 6 all-reduces per layer, Megatron-LM's
    count under full recomputation (a whole forward more, its collectives included: Korthikanti et
    al. 2022). torch's non-reentrant checkpoint ("early-stop", the default: ringzero's engine) stops
    once the last tensor backward needs is rebuilt (the second MLP matrix's input), so the block's
    final reduction is not repeated: 4 + 1. Under sequence parallelism each all-reduce is a
    reduce-scatter and an all-gather, and the same holds for each (the recomputed forward's two
    all-gathers run either way)."""
    if replay not in REPLAYS:
        raise ValueError(f"replay={replay!r} is not supported; allowed: {', '.join(REPLAYS)}")
    full = recompute == "full"
    again = (2 if replay == "whole" else 1) if full else 0       # reductions of the replayed forward
    if sequence_parallel:        # every all-reduce becomes a reduce-scatter and an all-gather
        return [("sequence-parallel reduce-scatter", "reduce_scatter", 4 + again),
                ("sequence-parallel all-gather", "all_gather", 4 + 2 * full)]
    return [("activation all-reduce", "all_reduce", 4 + again)]


def collectives(m: ModelShape, b: int, tp: int, *, sequence_parallel: bool = False,
                recompute: str = "none", replay: str = "early-stop", layers: int | None = None,
                first: bool = True, last: bool = True) -> list[tuple[str, str, int, int]]:
    """The tp collectives of one micro-batch: (what, collective, elements, calls), in activation
    elements except the cross-entropy's fp32 ones (empty when tp = 1). A pipeline stage runs
    `layers` blocks, the embedding's collectives only if `first`, the head's and loss's if `last`."""
    if tp == 1:
        return []
    bsh, bs = b * m.seq * m.hidden, b * m.seq
    n = m.layers if layers is None else layers
    out = [(what, c, bsh, k * n) for what, c, k in layer_collectives(sequence_parallel, recompute, replay) if n]
    if sequence_parallel:
        out += [("embedding all-reduce", "all_reduce", bsh, 1),
                ("embedding output scattered, its gradient all-gathered", "all_gather", bsh, 1)] if first else []
        out += [("head input all-gather, its gradient reduce-scattered", "all_gather", bsh, 1),
                ("", "reduce_scatter", bsh, 1)] if last else []
    else:
        out += [("embedding all-reduce", "all_reduce", bsh, 1)] if first else []
        out += [("head input gradient all-reduce", "all_reduce", bsh, 1)] if last else []
    return out + ([("cross-entropy max, sum, target (fp32)", "all_reduce", bs, 3)] if last else [])
