"""Pipeline schedules as data: the order in which each stage runs its forwards and backwards.

One description of every schedule, read by the engine (which runs it) and the planner (which
predicts its bubble and the activations a stage holds):

    gpipe        every forward, then every backward (Huang et al. 2019)
    1f1b         PipeDream-Flush (Narayanan et al. 2021 §2.2): stage i runs p - i - 1 warm-up
                 forwards, then one forward and one backward in turn, then the remaining backwards
    interleaved  1F1B over v model chunks per stage (Narayanan et al. 2021 §2.2.2): the model is cut
                 into p·v chunks and stage i holds chunks i, i + p, ..., i + (v-1)·p; micro-batches
                 go through the chunks in groups of p, so m must be a multiple of p

An `Action` is one chunk's forward or backward of one micro-batch. `simulate` plays the actions of
every stage with fixed costs and instantaneous messages: it is the planner's bubble and the check
that a schedule cannot deadlock (a stage waiting for a message that is never sent stalls the
simulation, which raises). With forward cost f and backward cost b per stage, every stage is idle
(p-1)·(f+b) of a step of (m+p-1)·(f+b) under GPipe and 1F1B, so the bubble fraction is
(p-1)/(m+p-1); interleaving cuts each chunk's costs by v, so it is (p-1)/(v·m+p-1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class Action:
    kind: str
    """"F" (forward) or "B" (backward)."""
    micro: int
    chunk: int
    """The stage's local chunk 0..v-1; its global index is chunk·p + stage."""


def check(pp: int, layers: int, microbatches: int, schedule: str, virtual_stages: int = 1) -> None:
    """A one-line ValueError when `schedule` cannot run this pipeline."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is not supported; allowed: {', '.join(SCHEDULES)}")
    for name, v in (("pp", pp), ("micro-batches", microbatches), ("virtual stages", virtual_stages)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if virtual_stages > 1 and schedule != "interleaved":
        raise ValueError(f"virtual stages ({virtual_stages}) need the interleaved schedule, not {schedule!r}")
    chunks = pp * virtual_stages
    if chunks > layers:
        raise ValueError(f"pp x virtual stages = {pp} x {virtual_stages} = {chunks} is more than the "
                         f"{layers} layers: every model chunk needs at least one layer")
    if schedule == "interleaved" and microbatches % pp:
        raise ValueError(f"the interleaved schedule needs the micro-batches ({microbatches}) to be a "
                         f"multiple of pp={pp} (it runs them in groups of pp)")


def _interleaved_unit(k: int, pp: int, v: int, forward: bool) -> tuple[int, int]:
    """(micro, chunk) of the k-th forward (or backward) of an interleaved stage: groups of pp
    micro-batches go through chunk 0, 1, ..., v-1 (backward: v-1, ..., 0)."""
    chunk = (k // pp) % v
    micro = (k // (pp * v)) * pp + k % pp
    return micro, chunk if forward else v - 1 - chunk


def warmup(stage: int, pp: int, microbatches: int, schedule: str, virtual_stages: int = 1) -> int:
    """Forwards a stage runs before its first backward (in chunk forwards)."""
    units = microbatches * virtual_stages
    if schedule == "gpipe":
        return units
    if schedule == "1f1b" or virtual_stages == 1:
        return min(pp - stage - 1, units)
    return min((pp - stage - 1) * 2 + (virtual_stages - 1) * pp, units)


def actions(stage: int, pp: int, microbatches: int, schedule: str, virtual_stages: int = 1) -> list[Action]:
    """The forwards and backwards stage `stage` runs in one step, in order."""
    v = virtual_stages
    units = microbatches * v
    if schedule == "interleaved":
        unit = lambda k, fwd: _interleaved_unit(k, pp, v, fwd)  # noqa: E731
    else:
        unit = lambda k, fwd: (k, 0)  # noqa: E731
    fwd = [Action("F", *unit(k, True)) for k in range(units)]
    bwd = [Action("B", *unit(k, False)) for k in range(units)]
    w = warmup(stage, pp, microbatches, schedule, v)
    out = fwd[:w]
    for k in range(units - w):
        out += [fwd[w + k], bwd[k]]
    return out + bwd[units - w:]


def inflight(stage: int, pp: int, microbatches: int, schedule: str, virtual_stages: int = 1) -> int:
    """Chunk micro-batches whose activations `stage` holds at its peak (a forward done, its backward
    not): GPipe m, 1F1B min(p - i, m), interleaved more on the first stages (its longer warm-up)."""
    return int(held_at_peak(stage, pp, microbatches, schedule, virtual_stages))


def held_at_peak(stage: int, pp: int, microbatches: int, schedule: str, virtual_stages: int = 1,
                 sizes: list[float] | None = None) -> float:
    """The most `stage` holds at once over its schedule: what each forward saves until its backward,
    `sizes[g]` (>= 0) for global chunk g (bytes of one micro-batch), or 1 per chunk when None."""
    local = [1.0 if sizes is None else sizes[c * pp + stage] for c in range(virtual_stages)]
    return max((sum(n * size for n, size in zip(counts, local))
                for counts in held_counts(stage, pp, microbatches, schedule, virtual_stages)), default=0.0)


@lru_cache(maxsize=8192)
def held_counts(stage: int, pp: int, microbatches: int, schedule: str, virtual_stages: int = 1
                ) -> tuple[tuple[int, ...], ...]:
    """The distinct (micro-batches of each of `stage`'s chunks held) right after each of its
    forwards: what it holds grows only there, so its peak for any chunk sizes is at one of them
    (cached: a search prices the same schedule for every model size, tp and ZeRO stage)."""
    counts, out = [0] * virtual_stages, set()
    for a in actions(stage, pp, microbatches, schedule, virtual_stages):
        counts[a.chunk] += 1 if a.kind == "F" else -1
        if a.kind == "F":
            out.add(tuple(counts))
    return tuple(sorted(out))


def messages(stage: int, pp: int, microbatches: int, schedule: str, virtual_stages: int = 1) -> dict[str, int]:
    """Point-to-point messages of `stage` per step: activations it sends (a forward of any chunk but
    the model's last) and receives (of any but the first), gradients it sends (a backward of any
    chunk but the first) and receives (of any but the last)."""
    last = pp * virtual_stages - 1
    out = dict.fromkeys(("activations_sent", "activations_received", "gradients_sent", "gradients_received"), 0)
    for a in actions(stage, pp, microbatches, schedule, virtual_stages):
        g = a.chunk * pp + stage
        if a.kind == "F":
            out["activations_sent"] += g < last
            out["activations_received"] += g > 0
        else:
            out["gradients_sent"] += g > 0
            out["gradients_received"] += g < last
    return out


def input_of(a: Action, stage: int, pp: int, virtual_stages: int = 1) -> tuple[str, int, int] | None:
    """The (kind, micro, global chunk) action whose output `stage`'s action `a` waits for: the
    previous chunk's forward (an activation), the next chunk's backward (a gradient), its own
    forward for the model's last chunk's backward; None for the first chunk's forwards."""
    g, last = a.chunk * pp + stage, pp * virtual_stages - 1
    if a.kind == "F":
        return ("F", a.micro, g - 1) if g > 0 else None
    return ("B", a.micro, g + 1) if g < last else ("F", a.micro, g)


def in_order(pp: int, microbatches: int, schedule: str, virtual_stages: int, done) -> Iterator[tuple[int, int, Action]]:
    """(stage, index, action) of every stage's actions in an order that respects their inputs:
    a stage goes on while the action it is at finds its input (`input_of`) in `done`, which the
    caller fills as it runs each one. Raises RuntimeError if the stages wait on each other forever
    (the schedule would deadlock)."""
    todo = [actions(i, pp, microbatches, schedule, virtual_stages) for i in range(pp)]
    pos = [0] * pp
    while any(pos[i] < len(todo[i]) for i in range(pp)):
        moved = False
        for i in range(pp):
            while pos[i] < len(todo[i]):
                a = todo[i][pos[i]]
                need = input_of(a, i, pp, virtual_stages)
                if need is not None and need not in done:
                    break
                yield i, pos[i], a
                pos[i] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"{schedule} with pp={pp}, m={microbatches}, v={virtual_stages} deadlocks: "
                               f"stages wait at actions {pos}")


def simulate(pp: int, microbatches: int, schedule: str, virtual_stages: int = 1,
             forward: float = 1.0, backward: float = 2.0) -> list[list[tuple[Action, float, float]]]:
    """Per stage, its actions with (start, end) when a chunk's forward costs forward/v and its
    backward backward/v, messages are instantaneous and every stage runs its actions in order
    (`in_order`, which raises if the schedule deadlocks)."""
    v = virtual_stages
    done: dict[tuple[str, int, int], float] = {}        # (kind, micro, global chunk) -> end
    out: list[list] = [[] for _ in range(pp)]
    free = [0.0] * pp
    for i, _, a in in_order(pp, microbatches, schedule, v, done):
        need = input_of(a, i, pp, v)
        start = max(free[i], done[need] if need else 0.0)
        end = start + (forward if a.kind == "F" else backward) / v
        done[(a.kind, a.micro, a.chunk * pp + i)] = free[i] = end
        out[i].append((a, start, end))
    return out


def idle_fraction(timeline: list[list[tuple[object, float, float]]]) -> float:
    """Mean over stages of the time a stage is not computing, over the whole step (first start to
    last end over all stages): the bubble fraction of a measured or simulated step."""
    t0 = min(s for stage in timeline for _, s, _ in stage)
    t1 = max(e for stage in timeline for _, _, e in stage)
    span = t1 - t0
    if span <= 0:
        return 0.0
    return sum(1 - sum(e - s for _, s, e in stage) / span for stage in timeline) / len(timeline)


def effective_virtual_stages(schedule: str, virtual_stages: int) -> int:
    """The model chunks per stage that `schedule` runs: v under the interleaved schedule (Narayanan
    et al. 2021 §2.2.2), 1 under GPipe and 1F1B, which run one chunk per stage whatever v says."""
    return virtual_stages if schedule == "interleaved" else 1


def bubble_fraction(pp: int, microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """(p-1)/(m+p-1), and (p-1)/(v·m+p-1) interleaved (Narayanan et al. 2021 §2.2)."""
    v = effective_virtual_stages(schedule, virtual_stages)
    return (pp - 1) / (v * microbatches + pp - 1)


def bubble_seconds(compute: float, fraction: float) -> float:
    """Idle seconds of a stage that computes for `compute` seconds a step, with bubble fraction
    `fraction` (`bubble_fraction`): the bubble is that fraction of compute + bubble, so it is
    compute x f/(1-f), (p-1)/m x the compute under 1F1B (Narayanan et al. 2021 §2.2)."""
    return compute * fraction / (1 - fraction)


def partition(costs: list[float], chunks: int, first: float = 0.0, last: float = 0.0) -> list[range]:
    """Contiguous ranges of the layers whose `costs` are given, one per chunk, minimising the
    busiest chunk's cost; the first chunk also pays `first` (the embedding), the last `last` (the
    final norm, head and loss). Every chunk gets at least one layer."""
    n = len(costs)
    if not 1 <= chunks <= n:
        raise ValueError(f"cannot cut {n} layers into {chunks} chunks of at least one layer")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(k: int, a: int, b: int) -> float:           # chunk k holding layers a..b-1
        return prefix[b] - prefix[a] + (first if k == 0 else 0.0) + (last if k == chunks - 1 else 0.0)

    # best[k][j]: least possible busiest cost of layers 0..j-1 in chunks 0..k; cut[k][j]: where chunk k
    # begins, the first such start. For chunk k ending at j, best[k-1][a] rises with a and cost(k, a, j)
    # falls (costs > 0), so the best start is at their crossing: the first a where the earlier chunks
    # cost at least chunk k, or the one before it (a bisection instead of trying every a).
    best = [[math.inf] * (n + 1) for _ in range(chunks)]
    cut = [[0] * (n + 1) for _ in range(chunks)]
    for j in range(1, n + 1):
        best[0][j] = cost(0, 0, j)
    for k in range(1, chunks):
        prev = best[k - 1]
        for j in range(k + 1, n + 1):
            lo, hi = k, j                                 # the crossing c in [k, j]
            while lo < hi:
                mid = (lo + hi) // 2
                if prev[mid] >= cost(k, mid, j):
                    hi = mid
                else:
                    lo = mid + 1
            a = lo - 1 if lo > k else lo
            if lo < j and lo > k and prev[lo] < cost(k, lo - 1, j) - 1e-12:
                a = lo
            best[k][j], cut[k][j] = max(prev[a], cost(k, a, j)), a
    bounds, j = [n], n
    for k in range(chunks - 1, 0, -1):
        j = cut[k][j]
        bounds.append(j)
    bounds.append(0)
    bounds.reverse()
    return [range(bounds[k], bounds[k + 1]) for k in range(chunks)]


def message_numel(micro_batch: int, seq: int, hidden: int, tp: int = 1) -> int:
    """Values in one message between stages per tp rank: a (b, s, h) activation or its gradient,
    1/t of it per tp rank (Megatron's scatter/gather, or sequence parallelism's split; Narayanan
    et al. 2021 §4.1)."""
    return micro_batch * seq * hidden // tp


def boundary_bytes(microbatches: int, micro_batch: int, seq: int, hidden: int, itemsize: int,
                   tp: int = 1) -> int:
    """Bytes one tp rank sends over one stage boundary per step, both directions: 2·m·b·s·h values
    (activations forward, their gradients backward), 1/t of them per tp rank."""
    return 2 * microbatches * message_numel(micro_batch, seq, hidden, tp) * itemsize
