"""Why a search's winner wins, in short sentences with the estimates' numbers: against the
runner-up, against its own configuration with one memory saving undone (or why it needs what they
lack), and against plain data parallelism (`plan.search.space.SearchResult.why`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringzero.plan.words import gpus, plural

if TYPE_CHECKING:  # only for annotations: search.py imports this module
    from ringzero.plan.config import Parallel
    from ringzero.plan.estimate import Estimate
    from ringzero.plan.search.space import SearchResult

GB = 1e9


def schedule_label(p: Parallel) -> str:
    """A pipeline schedule in words: "1f1b", or "interleaved, v=2" with its chunks per rank."""
    return f"{p.schedule}, v={p.virtual_stages}" if p.schedule == "interleaved" else p.schedule


def label(e: Estimate) -> str:
    """A configuration in one line: "dp=16 tp=8 pp=8 zero=1 mb=1 recompute=selective sp"."""
    p, t = e.parallel, e.training
    s = f"dp={p.dp} tp={p.tp} pp={p.pp} zero={p.zero} mb={t.micro_batch}"
    s += f" recompute={p.recompute}" if p.recompute != "none" else ""
    s += " sp" if p.sequence_parallel else ""
    s += f" offload={p.offload}" if p.offload != "none" else ""
    if p.pp > 1:
        s += f" {p.schedule}" + (f" v={p.virtual_stages}" if p.schedule == "interleaved" else "")
    return s


_PARTS = (("compute", "compute"), ("exposed_comm", "exposed communication"), ("bubble", "pipeline bubble"),
          ("offload", "offload"))


def _because(slow: Estimate, fast: Estimate) -> str:
    """The step-time component that differs most between two estimates, in words."""
    attr, words = max(_PARTS, key=lambda p: abs(getattr(slow.time, p[0]) - getattr(fast.time, p[0])))
    return f"{words} {getattr(slow.time, attr):.3g} s vs {getattr(fast.time, attr):.3g} s"


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _faster(b: Estimate, other: Estimate, what: str) -> str:
    ratio = other.time.step / b.time.step
    if ratio < 1.0005:
        tie = f"Ties with {what} {label(other)} ({other.time.step:.4g} s vs {b.time.step:.4g} s per step)"
        free_b, free_o = (e.hardware.hbm_bytes - e.memory.total for e in (b, other))
        if free_b > free_o:     # the search breaks a tie by memory headroom
            return f"{tie} and leaves more HBM free: {_gb(free_b)} vs {_gb(free_o)}."
        return tie + "."
    return f"{ratio:.2f}x faster than {what} {label(other)} ({other.time.step:.3g} s): {_because(other, b)}."


def _changed(b: Estimate, n: Estimate) -> tuple[str, str]:
    """(what best[0] has, what the neighbour has instead), in words."""
    p, q = b.parallel, n.parallel
    if p.zero != q.zero:
        return f"ZeRO-{p.zero}", f"ZeRO-{q.zero}"
    if p.recompute != q.recompute:
        return f"{p.recompute.capitalize()} recomputation", f"recompute={q.recompute}"
    if p.offload != q.offload:
        return f"Offload to {p.offload}", f"offload={q.offload}"
    return "Sequence parallelism", "no sequence parallelism"


def explain(r: SearchResult) -> list[str]:
    """The sentences of `SearchResult.why`."""
    if not r.best:
        if r.closest is None:
            return [f"No configuration to evaluate on {gpus(r.gpus)}: no dp x tp x pp split has tp "
                    "dividing the heads and kv heads (tp <= max_tp) and pp dividing the layers, with "
                    f"micro-batch x dp dividing the global batch of {r.global_batch}."]
        c = r.closest
        return [f"Nothing fits: all {plural(r.evaluated, 'configuration')} exceed {_gb(c.hardware.hbm_bytes)} HBM; "
                f"the leanest, {label(c)}, needs {_gb(c.memory.total)}."]
    b, hbm = r.best[0], r.best[0].hardware.hbm_bytes
    out = [f"{label(b)}: {b.time.step:.3g} s per step, {b.tokens_per_s:,.0f} tokens/s, MFU {b.mfu:.1%}, "
           f"{_gb(b.memory.total)} of {_gb(hbm)} HBM."]
    if len(r.best) > 1:
        out.append(_faster(b, r.best[1], "the runner-up"))
    for n in r.neighbours():
        has, lacks = _changed(b, n)
        if not n.fits:
            out.append(f"{has} is needed: {lacks} would need {_gb(n.memory.total)} > {_gb(hbm)} HBM.")
        else:
            out.append(f"{lacks[0].upper() + lacks[1:]} also fits ({_gb(n.memory.total)}) but takes "
                       f"{n.time.step / b.time.step:.2f}x as long: {_because(n, b)}.")
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
        out.append(_faster(b, base, "plain data parallelism") if base.fits else
                   f"Plain data parallelism ({label(base)}) would need {_gb(base.memory.total)} > {_gb(hbm)} HBM.")
    return out
