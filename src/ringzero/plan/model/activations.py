"""Activation memory: the bytes saved for backward (Korthikanti et al. 2022).

Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", §4.1) count
every tensor one transformer block keeps for its backward, in fp16 with dropout and eager
attention, per micro-batch of b sequences of s tokens, hidden h, a heads:

    attention  11·sbh + 5·a·s²·b    QKV input 2, Q and K 4, V 2, output-projection input 2,
                                    dropout mask 1 (·sbh); softmax output 2, its dropout mask 1,
                                    dropout output 2 (·a·s²·b)
    MLP        19·sbh               fc1 input 2, GELU input 8, fc2 input 8, dropout mask 1
    norms       4·sbh               the two LayerNorm inputs
    block      34·sbh + 5·a·s²·b    bytes                                    (`KORTHIKANTI`)

`layer_terms` itemises the same tensors for any shape and setting, so each term can be checked
against what autograd saves: p bytes per value (2 for fp16/bf16, 4 for fp32) and 1 per dropout
mask; K and V shrink by kv_heads/heads under grouped-query attention; the MLP holds
ffn-wide tensors (4h by default: the 8·sbh terms) and, gated (SwiGLU), four of them (both up
projections, the SiLU output and their product). Without dropout the masks and the dropout
output vanish. Flash attention (Dao et al. 2022) stores no s x s tensor, only an fp32
log-sum-exp per head and row (4·a·s·b bytes).

Tensor parallelism over t ranks splits everything between the column- and row-parallel linears
(by t); the norms' inputs, the QKV/fc1 inputs and the block's dropout masks stay replicated
unless sequence parallelism splits them too (Korthikanti eq. 2 and 3:
sbh·(10 + 24/t + 5as/(ht)) and sbh/t·(34 + 5as/h)).

Recomputation: "selective" drops the s x s terms (they are recomputed from Q and K: eq. 4,
34·sbh/t with sequence parallelism); "full" keeps only each block's input (2·sbh, /t with
sequence parallelism) and re-runs the block in backward, when one block's activations are live
again at once (`activation_bytes` adds that working set).

Pipelines: a stage holds the activations of the micro-batches its schedule has started and not yet
finished backward, counted by playing the schedule itself (`plan.pipeline.schedule.inflight`): m under
GPipe, min(p - i, m) under 1F1B on stage i, and more on the first stages under the interleaved
schedule (Narayanan et al. 2021 §2.2): 2(p-1) + (v-1)·p + 1 chunk micro-batches of L/(p·v)
blocks on the first, L·(1 + (p-1)/(p·v)) blocks' worth against 1F1B's L (Korthikanti et al. 2022
§4.2.3). An uneven cut weights each chunk by its own blocks (`activation_bytes`' `chunks`).
"""

from __future__ import annotations

import math

from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.model.shapes import ModelShape

KORTHIKANTI_SBH = 34
KORTHIKANTI_AS2B = 5


def korthikanti(b: int, s: int, h: int, a: int) -> int:
    """Korthikanti et al. 2022 eq. 1: 34·b·s·h + 5·a·s²·b bytes per layer (fp16, dropout, eager, no TP)."""
    return KORTHIKANTI_SBH * b * s * h + KORTHIKANTI_AS2B * a * s * s * b


def layer_terms(m: ModelShape, b: int, s: int, *, value_bytes: int = 2, dropout: bool = True,
                flash: bool = False, tp: int = 1, sp: bool = False, recompute: str = "none",
                mask_bytes: int = 1, sp_keeps_gathered: bool = False) -> dict[str, float]:
    """Bytes each saved tensor of one block takes per micro-batch, by name (see the module doc).

    `mask_bytes` is what one dropout-mask element costs: 1 for a fused kernel's boolean mask (GPUs,
    Korthikanti et al.), `value_bytes` for torch's CPU dropout, which keeps its scaled noise tensor
    in the activations' dtype. `sp_keeps_gathered`: under sequence parallelism the column-parallel
    linears' inputs are saved as all-gathered (whole sequence), as plain autograd does; Korthikanti
    et al. (and Megatron) save the sequence slice and all-gather it again in backward.
    """
    p, t = value_bytes, tp
    sbh, sbf = s * b * m.hidden, s * b * m.ffn_dim
    rep = t if sp else 1                     # replicated tensors are split only with SP
    gathered = 1 if sp_keeps_gathered else rep
    if recompute == "full":
        return {"block_input": p * sbh / rep}
    kv = m.kv / m.heads
    terms = {
        "norm_inputs": 2 * p * sbh / rep,
        "qkv_input": p * sbh / gathered,
        "q": p * sbh / t,
        "k_v": 2 * p * sbh * kv / t,
        "attention_out": p * sbh / t,        # input of the output projection
        "fc1_input": p * sbh / gathered,
        "mlp_inner": (4 if m.gated else 2) * p * sbf / t,
    }
    if dropout:
        terms["dropout_masks"] = 2 * mask_bytes * sbh / rep   # after attention and after the MLP
    scores = m.heads * s * s * b / t
    if flash:
        terms["softmax_lse"] = 4 * m.heads * s * b / t
    elif recompute != "selective":
        terms["softmax"] = p * scores
        if dropout:
            terms["attention_dropout"] = (p + mask_bytes) * scores    # output and mask
    return terms


def layer_bytes(m: ModelShape, b: int, s: int, **kw) -> float:
    """Bytes one block saves for backward per micro-batch (sum of `layer_terms`)."""
    return sum(layer_terms(m, b, s, **kw).values())


def inflight_microbatches(pp: int, microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1,
                          stage: int = 0) -> int:
    """Micro-batches (chunk micro-batches when interleaved) whose activations pipeline stage `stage`
    holds at its peak, from the schedule's own order of forwards and backwards
    (`plan.pipeline.schedule.inflight`): all m with GPipe, min(p - i, m) with 1F1B (Narayanan et al. 2021
    §2.2), and with the interleaved schedule the longer warm-up's 2(p - i - 1) + (v - 1)·p + 1 on
    the first stages (§2.2.2). Without a pipeline one: gradient accumulation frees each
    micro-batch's activations in its backward."""
    if pp == 1:
        return 1
    return pipeline.inflight(stage, pp, microbatches, schedule, virtual_stages)


def stage_activation_layers(layers: int, pp: int, microbatches: int, schedule: str = "1f1b",
                            virtual_stages: int = 1, stage: int = 0) -> int:
    """Blocks x micro-batches whose activations stage `stage` holds at its peak: the in-flight
    (chunk) micro-batches times ceil(L/(p·v)) blocks per chunk (with v = 1, ceil(L/p) per stage)."""
    v = pipeline.effective_virtual_stages(schedule, virtual_stages)
    per_chunk = math.ceil(layers / (pp * v))
    return per_chunk * inflight_microbatches(pp, microbatches, schedule, v, stage)


def activation_bytes(m: ModelShape, b: int, s: int, *, pp: int = 1, microbatches: int = 1,
                     schedule: str = "1f1b", recompute: str = "none", virtual_stages: int = 1,
                     stage: int = 0, chunks: tuple[int, ...] | None = None, head: float = 0.0, **kw) -> float:
    """Peak bytes of activations on pipeline stage `stage` (by default the first, which holds the
    most micro-batches under every schedule).

    Each forward of a model chunk saves its blocks' activations until its backward; the peak is
    played from the schedule (`pipeline.held_at_peak`). `chunks` gives the blocks of each of the
    p·v global chunks (`pipeline_layout.chunk_layers`: a cut balanced by cost, uneven when p·v does
    not divide L); None: ceil(L/(p·v)) each. `head` is what the embedding, head and loss save per
    micro-batch (`head_bytes`), held with the last chunk. With full recomputation one block's
    activations are rebuilt during its backward on top.
    """
    v = pipeline.effective_virtual_stages(schedule, virtual_stages)
    per_layer = layer_bytes(m, b, s, recompute=recompute, **kw)
    if pp == 1:
        total = m.layers * per_layer + head
    else:
        n = pp * v
        sizes = [k * per_layer for k in (chunks or [math.ceil(m.layers / n)] * n)]
        sizes[-1] += head
        total = pipeline.held_at_peak(stage, pp, microbatches, schedule, v, sizes)
    if recompute == "full":
        total += layer_bytes(m, b, s, recompute="none", **kw)
    return total


def head_bytes(m: ModelShape, b: int, s: int, *, value_bytes: int = 2, tp: int = 1, sp: bool = False,
               dropout: bool = False, mask_bytes: int = 1, vocab: int | None = None) -> float:
    """Outside the blocks: the embedding dropout's mask (when `dropout`), the final-norm input and
    the head input (p·sbh each; with sequence parallelism the mask and the norm input hold a 1/t
    slice of the sequence, the head input is all-gathered) and the fp32 log-probabilities the
    cross-entropy keeps (4·s·b·V/t, Korthikanti et al. §4.1; `vocab`: V padded for tp, if it is)."""
    rep = tp if sp else 1
    embedding = mask_bytes * s * b * m.hidden / rep if dropout else 0
    return embedding + value_bytes * s * b * m.hidden * (1 + 1 / rep) + 4 * s * b * (vocab or m.vocab) / tp
