"""What a configuration search takes and returns: the `Space` it enumerates for each dp x tp x pp
split, and the `SearchResult` it ranks, with the alternatives its `why` weighs the winner against
(the runner-up, the winner with one memory saving undone, plain data parallelism). The search
itself, and what the space means, is `plan.search.space`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ringzero.plan.config import OFFLOADS, RECOMPUTES, SCHEDULES, Parallel, Training
from ringzero.plan.estimate import Estimate, estimate
from ringzero.plan.hardware import Hardware
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.search.why import GB, because, changed, faster, gb, label
from ringzero.plan.words import gpus, plural


def _tuple(name: str, values, allowed, kind) -> tuple:
    """`values` as a tuple without duplicates, each of type `kind` and in `allowed` (if given)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"space {name} must be a tuple, got {values!r}")
    values = tuple(values)
    if not values:
        raise ValueError(f"space {name} must not be empty")
    for v in values:
        if type(v) is not kind:
            raise ValueError(f"space {name} values must be {kind.__name__}, got {v!r}")
        if allowed is not None and v not in allowed:
            raise ValueError(f"space {name}={v!r} is not supported; allowed: {', '.join(map(str, allowed))}")
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class Space:
    """What the search enumerates for each dp x tp x pp split (lists are accepted and deduplicated)."""

    zero: tuple[int, ...] = (0, 1, 2, 3)
    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    recompute: tuple[str, ...] = RECOMPUTES
    sequence_parallel: tuple[bool, ...] = (False, True)
    """Only tried when tp > 1 (tp = 1 runs without)."""
    offload: tuple[str, ...] = ("none",)
    """"cpu"/"nvme" are tried only with ZeRO >= 1."""
    schedules: tuple[str, ...] = ("1f1b",)
    virtual_stages: int = 2
    """Model chunks per rank the "interleaved" schedule is tried with."""
    max_tp: int | None = None
    """Largest tensor-parallel degree (None: the hardware's gpus_per_node)."""

    def __post_init__(self) -> None:
        checks = {"zero": ((0, 1, 2, 3), int), "micro_batches": (None, int), "recompute": (RECOMPUTES, str),
                  "sequence_parallel": ((False, True), bool), "offload": (OFFLOADS, str),
                  "schedules": (SCHEDULES, str)}
        for name, (allowed, kind) in checks.items():
            object.__setattr__(self, name, _tuple(name, getattr(self, name), allowed, kind))
        if min(self.micro_batches) < 1:
            raise ValueError(f"space micro_batches must be >= 1, got {min(self.micro_batches)}")
        if type(self.virtual_stages) is not int or self.virtual_stages < 1:
            raise ValueError(f"space virtual_stages must be an int >= 1, got {self.virtual_stages!r}")
        if self.max_tp is not None and (type(self.max_tp) is not int or self.max_tp < 1):
            raise ValueError(f"space max_tp must be None or an int >= 1, got {self.max_tp!r}")


@dataclass(frozen=True)
class SearchResult:
    """The ranked configurations of one search, and what it cost."""

    best: list[Estimate]
    """Top-k fitting configurations, fastest step first (ties, within `TIE_RTOL`: the one with more
    memory headroom per GPU, then the earlier, simpler split; `rank`)."""
    evaluated: int
    """Configurations evaluated (memory and, when it fits, time)."""
    fitting: int
    seconds: float
    """Wall time of the search."""
    gpus: int = 0
    global_batch: int = 0
    """Sequences per step of every configuration: training.global_batch when set, otherwise
    gpus x min(space.micro_batches) (see the module doc)."""
    space: Space | None = None
    """What was enumerated (`neighbours` stays inside it)."""
    closest: Estimate | None = None
    """When nothing fits: the configuration that needs the least memory."""

    @property
    def rate(self) -> float:
        """Configurations evaluated per second."""
        return self.evaluated / self.seconds if self.seconds > 0 else 0.0

    def baseline(self) -> Estimate | None:
        """The simplest alternative to best[0]: plain data parallelism (dp = gpus, ZeRO-0, no
        recomputation, the smallest micro-batch), None when nothing fits or it cannot run."""
        if not self.best:
            return None
        b = self.best[0]
        mb = min(self.space.micro_batches) if self.space else 1
        return _try(b.model, dataclasses.replace(b.training, micro_batch=mb), Parallel(dp=b.parallel.gpus),
                    b.hardware)

    def neighbours(self) -> list[Estimate]:
        """best[0] with one memory saving undone, each to the next lighter value in the space: a lower
        ZeRO stage, lighter recomputation, less offload, no sequence parallelism."""
        if not self.best:
            return []
        b, space = self.best[0], self.space or Space()
        p, out = b.parallel, []
        lighter = {"zero": sorted(z for z in space.zero if z < p.zero),
                   "recompute": [r for r in RECOMPUTES[:RECOMPUTES.index(p.recompute)] if r in space.recompute],
                   "offload": [o for o in OFFLOADS[:OFFLOADS.index(p.offload)] if o in space.offload],
                   "sequence_parallel": [False] if p.sequence_parallel and False in space.sequence_parallel else []}
        for field, values in lighter.items():
            if values:                                 # the nearest lighter value: the last one
                change = {field: values[-1]} | ({"offload": "none"} if field == "zero" and values[-1] == 0 else {})
                e = _try(b.model, b.training, dataclasses.replace(p, **change), b.hardware)
                out += [e] if e is not None else []
        return out

    def why(self) -> list[str]:
        """Short sentences, numbers from the estimates: why best[0] wins over the runner-up, over
        its lighter neighbours (or why it needs what they lack) and over plain data parallelism
        (`explain` below, in the words of `plan.search.why`)."""
        return explain(self)


def _try(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> Estimate | None:
    try:
        return estimate(m, tr, par, hw)
    except ValueError:      # e.g. the global batch does not divide by micro-batch x dp
        return None


def explain(r: SearchResult) -> list[str]:
    """The sentences of `SearchResult.why`."""
    if not r.best:
        if r.closest is None:
            return [f"No configuration to evaluate on {gpus(r.gpus)}: no dp x tp x pp split has tp "
                    "dividing the heads and kv heads (tp <= max_tp) and pp dividing the layers, with "
                    f"micro-batch x dp dividing the global batch of {r.global_batch}."]
        c = r.closest
        return [f"Nothing fits: all {plural(r.evaluated, 'configuration')} exceed {gb(c.hardware.hbm_bytes)} HBM; "
                f"the leanest, {label(c)}, needs {gb(c.memory.total)}."]
    b, hbm = r.best[0], r.best[0].hardware.hbm_bytes
    out = [f"{label(b)}: {b.time.step:.3g} s per step, {b.tokens_per_s:,.0f} tokens/s, MFU {b.mfu:.1%}, "
           f"{gb(b.memory.total)} of {gb(hbm)} HBM."]
    if len(r.best) > 1:
        out.append(faster(b, r.best[1], "the runner-up"))
    for n in r.neighbours():
        has, lacks = changed(b, n)
        if not n.fits:
            out.append(f"{has} is needed: {lacks} would need {gb(n.memory.total)} > {gb(hbm)} HBM.")
        else:
            out.append(f"{lacks[0].upper() + lacks[1:]} also fits ({gb(n.memory.total)}) but takes "
                       f"{n.time.step / b.time.step:.2f}x as long: {because(n, b)}.")
    p, hw, by_kind = b.parallel, b.hardware, b.time.comm_by_kind
    if p.tp > 1:
        out.append(f"tp={p.tp} keeps tensor-parallel all-reduces on NVLink ({hw.intra_bw / GB:.0f} GB/s): "
                   f"{by_kind.get('tp', 0.0):.3g} s per step.")
    if p.dp > 1:
        spans = any(o.spans_nodes for o in b.ops if o.kind in ("dp", "zero"))
        link = f"the network ({hw.inter_bw / GB:.0f} GB/s)" if spans else f"NVLink ({hw.intra_bw / GB:.0f} GB/s)"
        out.append(f"dp={p.dp} syncs {'ZeRO shards' if p.zero else 'gradients'} over {link}: "
                   f"{by_kind.get('dp', 0.0) + by_kind.get('zero', 0.0):.3g} s per step; "
                   f"{b.time.exposed_comm:.3g} s of all communication is exposed.")
    if p.pp > 1:
        out.append(f"pp={p.pp} costs a {b.time.bubble_fraction:.1%} pipeline bubble ({b.time.bubble:.3g} s) "
                   f"with {plural(b.training.accumulation(p.dp), 'micro-batch', 'micro-batches')} per step.")
    base = r.baseline()
    if base is not None and (base.parallel, base.training) != (p, b.training):
        out.append(faster(b, base, "plain data parallelism") if base.fits else
                   f"Plain data parallelism ({label(base)}) would need {gb(base.memory.total)} > {gb(hbm)} HBM.")
    return out
