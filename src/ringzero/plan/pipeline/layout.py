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

from fractions import Fraction
from functools import lru_cache

from ringzero.plan.model.flops import layer_flops_per_token
from ringzero.plan.model.shapes import ModelShape, attention_params, mlp_params, norm_params
from ringzero.plan.strategies.tensor_parallel import local_params, padded_vocab


def head_flops_per_token(m: ModelShape) -> float:
    """The tied head's matmul, forward and backward: 3 x 2·h·V."""
    return 6.0 * m.hidden * m.vocab


@lru_cache(maxsize=1024)
def chunk_layers(m: ModelShape, chunks: int) -> tuple[range, ...]:
    """The blocks of each of `chunks` global model chunks, in order."""
    return tuple(even_partition(m.layers, chunks, layer_flops_per_token(m), head_flops_per_token(m)))


def even_partition(layers: int, chunks: int, cost: float, last: float = 0.0) -> list[range]:
    """`pipeline.partition([cost] * layers, chunks, last=last)`, the same cut in O(log L) steps
    instead of its O(k·L·log L) (10,000 layers on 10,000 stages: seconds against hours).

    Every block costs the same, so the least busiest cost of j blocks in c head-free chunks is
    cost·ceil(j/c), and the programme's first least start leaves chunk c-1 exactly ceil(j/c) blocks:
    the head-free chunks are an even split with the larger ones last. Only the last chunk's size x
    is searched: the least max(cost·ceil((L-x)/(k-1)), cost·x + last), the largest such x (the
    programme's first least start). Compared exactly (as fractions) where the floats would tie."""
    if not 1 <= chunks <= layers:
        raise ValueError(f"cannot cut {layers} layers into {chunks} chunks of at least one layer")
    if chunks == 1:
        return [range(0, layers)]
    c, h, k = Fraction(cost), Fraction(last), chunks - 1

    def busiest(a: int) -> Fraction:                # the k head-free chunks hold a blocks
        return max(c * -(-a // k), c * (layers - a) + h)

    # the head-free chunks' cost rises with a and the last chunk's falls: bisect for the first a
    # where they cross; the best start is there or just before it
    lo, hi = k, layers - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if c * -(-mid // k) >= c * (layers - mid) + h:
            hi = mid
        else:
            lo = mid + 1
    a = lo - 1 if lo > k and busiest(lo - 1) <= busiest(lo) else lo
    q, r = divmod(a, k)
    sizes = [q] * (k - r) + [q + 1] * r + [layers - a]
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    return [range(starts[i], starts[i + 1]) for i in range(chunks)]


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
