"""Where a GPT's layers go in a pipeline: p·v model chunks balanced by cost, and what each stage holds.

The blocks are cut into contiguous chunks that minimise the busiest chunk's cost (`pipeline.partition`),
each block costing its forward + backward FLOPs per token (`flops.layer_flops_per_token`); the first
chunk also holds the embeddings (a lookup: no FLOPs) and the last the final norm and the tied head,
whose matmul costs 6·h·V per token forward and backward (2·h·V forward; Narayanan et al. 2021 §3.1
balance stages the same way, the output layer counted with the last). Stage i holds the global
chunks i, i + p, ..., i + (v-1)·p (interleaved; v = 1 otherwise).

Tied embeddings under a pipeline: the first stage holds the token embedding for its lookup and the
last stage a copy for the head; their gradients are summed between the two after backward, so the
copies stay equal (Megatron-LM's embedding group, Shoeybi et al. 2019; Narayanan et al. 2021).
"""

from __future__ import annotations

from functools import lru_cache

from .flops import layer_flops_per_token
from .pipeline import partition
from .shapes import ModelShape, attention_params, mlp_params, norm_params
from .tensor_parallel import local_params, padded_vocab


def head_flops_per_token(m: ModelShape) -> float:
    """The tied head's matmul, forward and backward: 3 x 2·h·V."""
    return 6.0 * m.hidden * m.vocab


@lru_cache(maxsize=1024)
def chunk_layers(m: ModelShape, chunks: int) -> tuple[range, ...]:
    """The blocks of each of `chunks` global model chunks, in order."""
    return tuple(partition([layer_flops_per_token(m)] * m.layers, chunks, last=head_flops_per_token(m)))


def stage_chunks(stage: int, pp: int, virtual_stages: int = 1) -> list[int]:
    """Global chunk indices held by pipeline rank `stage`."""
    return [c * pp + stage for c in range(virtual_stages)]


@lru_cache(maxsize=65536)
def stage_layers(m: ModelShape, stage: int, pp: int, virtual_stages: int = 1) -> int:
    """Blocks held by pipeline rank `stage`."""
    ranges = chunk_layers(m, pp * virtual_stages)
    return sum(len(ranges[g]) for g in stage_chunks(stage, pp, virtual_stages))


@lru_cache(maxsize=4096)
def busiest_stage_layers(m: ModelShape, pp: int, virtual_stages: int = 1) -> int:
    """The most blocks any pipeline rank holds (ceil(L/p) when the cut is even, and all L when pp = 1)."""
    return max(stage_layers(m, i, pp, virtual_stages) for i in range(pp))


@lru_cache(maxsize=4096)
def memory_candidates(m: ModelShape, pp: int, virtual_stages: int = 1) -> tuple[int, ...]:
    """The pipeline ranks that can hold the most memory: the first (embedding, and the most
    micro-batches in flight), the last (head and loss), and the first rank of each pattern of chunk
    sizes. Two ranks with the same chunks hold the same parameters, and the later one starts no
    more forwards before its first backward under any schedule (`pipeline.warmup` falls with the
    rank), so it never holds more activations."""
    ranges = chunk_layers(m, pp * virtual_stages)
    firsts: dict[tuple[int, ...], int] = {}
    for i in range(pp):
        firsts.setdefault(tuple(len(ranges[g]) for g in stage_chunks(i, pp, virtual_stages)), i)
    return tuple(sorted({0, pp - 1, *firsts.values()}))


def stage_flops_per_token(m: ModelShape, stage: int, pp: int, virtual_stages: int = 1,
                          recompute: str = "none") -> float:
    """Forward + backward FLOPs per token of pipeline rank `stage`: its blocks, and the head on the last."""
    return (layer_flops_per_token(m, recompute) * stage_layers(m, stage, pp, virtual_stages)
            + (head_flops_per_token(m) if stage == pp - 1 else 0.0))


@lru_cache(maxsize=65536)
def stage_params(m: ModelShape, tp: int, stage: int, pp: int, virtual_stages: int = 1) -> int:
    """Parameters one tp rank of pipeline rank `stage` holds: its blocks (their tp share), the token
    embedding's slice and the positions on the first stage, a copy of the token embedding's slice
    and the final norm on the last (`tensor_parallel.local_params` when pp = 1)."""
    if pp == 1:
        return local_params(m, tp)
    row_biases = 2 * m.hidden if m.bias else 0
    per_layer = (attention_params(m) + mlp_params(m) - row_biases) // tp + 2 * norm_params(m) + row_biases
    embedding = padded_vocab(m.vocab, tp) * m.hidden // tp
    n = stage_layers(m, stage, pp, virtual_stages) * per_layer
    if stage == 0:
        n += embedding + (m.seq * m.hidden if m.positions == "learned" else 0)
    if stage == pp - 1:
        n += embedding + norm_params(m)
    return n
