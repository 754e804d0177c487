"""One training step as events: every stage's pipeline actions in the engine's order, with the
engine's overlap rules, on the costs `step_costs` played on the topology.

Each stage runs `plan.pipeline.schedule.actions` in order on its compute stream. An action waits
for its input: the previous chunk's activation (forward) or the next chunk's gradient (backward),
sent when its producer finishes and arriving a played message time later (the engine's
non-blocking sends, received before the action: `pipeline_wait`). A wait is split into the time the
message was in flight ("pp", exposed point-to-point) and the rest ("bubble": the producer was still
computing, the schedule's own idle time). Tensor-parallel collectives block the compute stream
(Megatron-LM runs them inline). The gradient collectives run on a FIFO communication stream beside
it: DDP's and ZeRO-1's buckets during the last micro-batch's backward of each chunk, ready in turn
as backward walks the chunk from its last block (Li et al. 2020, PyTorch DDP §3.2.3), but under a
pipeline all of them after the stage's last backward, the flush (as the engine's `reduce_now` and
Megatron-LM's data-parallel all-reduce after `forward_backward` do: a stage's chunks end their
backwards at different times); ZeRO-2's after every micro-batch; ZeRO-3 all-gathers each block's weights on a stream of its own,
`prefetch` blocks ahead (FSDP's forward and backward prefetch), and reduce-scatters each block's
gradient when its backward ends. The optimizer starts when the stage's compute and its gradient
stream are done; ZeRO-1/2 then all-gather the updated weights.

All dp replicas run the same timeline, so one is played per stage. A straggler (a GPU computing
`factor` times slower) stretches its stage's compute; every collective of its tp and dp groups
waits for it, and event times only grow with any duration (a max-plus system), so its replica's
timeline is the one the job follows. Stragglers in two replicas are played as one replica slowed at
both (an upper bound, exact for one slow replica).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringzero.plan.pipeline.schedule import actions, in_order, input_of
from ringzero.simulate.step_costs import Costs

PARTS = ("compute", "tp", "pp", "bubble", "zero_gather", "dp", "optimizer", "offload", "weight_gather")
"""A stage's step, in the order it is spent (sums to the stage's end)."""


@dataclass(frozen=True)
class Span:
    lane: str
    """"compute", "comm" (the data-parallel stream) or "p2p"."""
    name: str
    start: float
    end: float
    kind: str = ""
    """The collective's kind (tp, pp, dp, zero) for communication spans."""


@dataclass
class Stage:
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    spans: list[Span] = field(default_factory=list)

    @property
    def end(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class Tail:
    """What follows the last backward on each stage: seconds of the optimizer and host offload."""

    optimizer: list[float]
    offload: float


class _Stream:
    """A FIFO stream: a call starts when it is ready and the previous one is done."""

    def __init__(self, kind: str, spans: list[Span]):
        self.free, self.kind, self.spans = 0.0, kind, spans

    def run(self, ready: float, seconds: float, name: str) -> float:
        start = max(ready, self.free)
        self.free = start + seconds
        if seconds:
            self.spans.append(Span("comm", name, start, self.free, self.kind))
        return self.free


def play_step(c: Costs, pp: int, micro: int, schedule: str, v: int, zero: int, prefetch: int,
              factors: dict[int, float], tail: Tail, inline: bool = False) -> list[Stage]:
    """Every stage's timeline and breakdown (module doc); `factors`: stage -> compute slowdown;
    `inline`: the gradient collectives take the compute's time (CPU ranks, whose communication
    thread runs on the cores backward uses) instead of running beside it."""
    last = pp * v - 1
    stages = [Stage() for _ in range(pp)]
    kind = "dp" if zero == 0 else "zero"
    comm = [_Stream(kind, st.spans) for st in stages]
    free = [0.0] * pp
    sent: dict[tuple[str, int, int], tuple[float, float]] = {}     # (kind, micro, chunk) -> (end, arrival)
    flush = pp > 1 and zero < 2              # the engine's `reduce_now`: dp buckets after the flush
    final_b = {(s, a.chunk): i for s in range(pp) for i, a in enumerate(actions(s, pp, micro, schedule, v))
               if a.kind == "B"}
    for s, i, a in in_order(pp, micro, schedule, v, sent):
        st, g, need = stages[s], a.chunk * pp + s, input_of(a, s, pp, v)
        produced, arrival = sent[need] if need else (0.0, 0.0)
        start = max(free[s], arrival)
        if start > free[s]:
            flight = arrival - max(free[s], produced) if arrival > produced else 0.0
            st.parts["pp"] += flight
            st.parts["bubble"] += start - free[s] - flight
            st.spans.append(Span("compute", "pipeline_wait", free[s], start))
        received = need is not None and need[2] != g
        buckets = zero == 2 or (zero < 2 and not flush and final_b[(s, a.chunk)] == i)
        end = free[s] = _action(c, st, s, a.kind, c.chunks[s][a.chunk], start, received, factors.get(s, 1.0), zero,
                                prefetch, comm[s], buckets, a.chunk, inline)
        nxt = g + 1 if a.kind == "F" else g - 1
        t = c.send[(s, nxt % pp)] if 0 <= nxt <= last and nxt % pp != s else 0.0
        sent[(a.kind, a.micro, g)] = (end, end + t)      # a chunk on the same stage: no message
        if t:
            st.spans.append(Span("p2p", "send" if a.kind == "F" else "send grad", end, end + t, "pp"))
    for s, st in enumerate(stages):
        if flush:
            for cut in c.buckets[s]:
                for collective, seconds in cut:
                    comm[s].run(free[s], seconds, collective)
        _tail(c, st, s, free[s], comm[s].free, tail)
    return stages


def _action(c: Costs, st: Stage, s: int, kind: str, chunk, start: float, received: bool, factor: float,
            zero: int, prefetch: int, stream: _Stream, buckets: bool, local: int, inline: bool = False) -> float:
    """Run one action from `start`; returns its end."""
    t = start
    if received and c.gather[s]:
        st.spans.append(Span("compute", "all_gather", t, t + c.gather[s], "tp"))
        t += c.gather[s]
        st.parts["tp"] += c.gather[s]
    name = "forward" if kind == "F" else "backward"
    compute = (chunk.forward if kind == "F" else chunk.backward) * factor
    tp = chunk.tp_forward if kind == "F" else chunk.tp_backward
    if zero == 3:
        return _layered(c, st, s, kind, chunk, t, compute, tp, 0 if inline else prefetch, stream, local, inline)
    st.spans.append(Span("compute", name, t, t + compute + tp))
    if tp:
        st.spans.append(Span("compute", "tp collectives", t + compute, t + compute + tp, "tp"))
    st.parts["compute"] += compute
    st.parts["tp"] += tp
    end = t + compute + tp
    if kind == "B" and buckets:
        cut = c.buckets[s][local]
        for k, (collective, seconds) in enumerate(cut):
            if inline:
                st.spans.append(Span("compute", collective, end, end + seconds, stream.kind))
                st.parts["dp"] += seconds
                end += seconds
            else:
                stream.run(t + (k + 1) / len(cut) * (end - t), seconds, collective)
    return end


def _layered(c: Costs, st: Stage, s: int, kind: str, chunk, t: float, compute: float, tp: float,
             prefetch: int, stream: _Stream, local: int, inline: bool = False) -> float:
    """A ZeRO-3 action block by block: each block waits for its weights' all-gather, issued when
    the block `prefetch` before it starts (FSDP's prefetch; 0: when the block itself is reached);
    in backward each block's gradient is reduce-scattered as soon as its backward ends. Gathers and
    reduce-scatters share the stage's one stream, in the order they are issued; `inline`: the
    reduce-scatter holds the compute until it is done too."""
    n = max(1, chunk.layers)
    per, cut = (compute + tp) / n, c.buckets[s][local]
    ready = {j: stream.run(t, c.layer_gather[s], "all_gather") for j in range(min(prefetch, n))}
    end = t
    for i in range(n):
        if i not in ready:
            ready[i] = stream.run(end, c.layer_gather[s], "all_gather")
        begin = max(end, ready[i])
        st.parts["zero_gather"] += begin - end
        if prefetch and i + prefetch < n:
            ready[i + prefetch] = stream.run(begin, c.layer_gather[s], "all_gather")
        end = begin + per
        if kind == "B" and cut:
            collective, seconds = cut[min(i, len(cut) - 1)]
            done = stream.run(end, seconds, collective)
            if inline:
                st.parts["dp"] += done - end
                end = done
    st.spans.append(Span("compute", "forward" if kind == "F" else "backward", t, end))
    st.parts["compute"] += compute
    st.parts["tp"] += tp
    return end


def _tail(c: Costs, st: Stage, s: int, computed: float, reduced: float, tail: Tail) -> None:
    """The optimizer after the last gradient, the host round trip, ZeRO-1/2's weight all-gather."""
    st.parts["dp"] += max(0.0, reduced - computed)
    t = max(computed, reduced)
    for name, seconds, part in (("optimizer", tail.optimizer[s], "optimizer"), ("offload", tail.offload, "offload")):
        if seconds:
            st.spans.append(Span("compute", name, t, t + seconds))
            st.parts[part] += seconds
            t += seconds
    for collective, seconds in c.after[s]:
        st.spans.append(Span("compute", collective, t, t + seconds, "zero"))
        st.parts["weight_gather"] += seconds
        t += seconds
