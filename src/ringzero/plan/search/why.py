"""The words of why a search's winner wins: a configuration in one line, and the sentences that
compare two estimates with their numbers. `plan.search.result.explain` puts them together for
`SearchResult.why` (against the runner-up, the lighter neighbours and plain data parallelism).
"""

from __future__ import annotations

from ringzero.plan.config import Parallel
from ringzero.plan.estimate import Estimate

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


def because(slow: Estimate, fast: Estimate) -> str:
    """The step-time component that differs most between two estimates, in words."""
    attr, words = max(_PARTS, key=lambda p: abs(getattr(slow.time, p[0]) - getattr(fast.time, p[0])))
    return f"{words} {getattr(slow.time, attr):.3g} s vs {getattr(fast.time, attr):.3g} s"


def gb(x: float) -> str:
    """Bytes in decimal GB (10^9 B), one decimal: the unit of every sentence here."""
    return f"{x / GB:.1f} GB"


def faster(b: Estimate, other: Estimate, what: str) -> str:
    """One sentence: how much faster `b` is than `other` and why, or that they tie (the search's tie
    rule: more HBM left free wins)."""
    ratio = other.time.step / b.time.step
    if ratio < 1.0005:
        tie = f"Ties with {what} {label(other)} ({other.time.step:.4g} s vs {b.time.step:.4g} s per step)"
        free_b, free_o = (e.hardware.hbm_bytes - e.memory.total for e in (b, other))
        if free_b > free_o:     # the search breaks a tie by memory headroom
            return f"{tie} and leaves more HBM free: {gb(free_b)} vs {gb(free_o)}."
        return tie + "."
    return f"{ratio:.2f}x faster than {what} {label(other)} ({other.time.step:.3g} s): {because(other, b)}."


def changed(b: Estimate, n: Estimate) -> tuple[str, str]:
    """(what best[0] has, what the neighbour has instead), in words."""
    p, q = b.parallel, n.parallel
    if p.zero != q.zero:
        return f"ZeRO-{p.zero}", f"ZeRO-{q.zero}"
    if p.recompute != q.recompute:
        return f"{p.recompute.capitalize()} recomputation", f"recompute={q.recompute}"
    if p.offload != q.offload:
        return f"Offload to {p.offload}", f"offload={q.offload}"
    return "Sequence parallelism", "no sequence parallelism"
