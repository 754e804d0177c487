"""The ring's pipelined overlap in the α-β-γ model: the bytes a rank moves behind earlier segments.

The ring cuts each chunk into segments and forwards a segment as soon as it has it, so in each of
its phases of n-1 steps with m segments per chunk, n-1+m-1 segment transfers lie on the critical
path instead of (n-1)·m (Patarasuk & Yuan 2009, §3: the pipelined ring). The rest are
"overlapped" (`plan.comm.volume.overlapped_bytes`). `comm.cost` fits their price as two columns of
their own, `OVERLAP` (the slowest rank's overlapped bytes, and all ranks' together), in place of β
and host_beta: β when nothing overlaps, 0 when the pipeline hides them completely.
"""

from __future__ import annotations

from ringzero.plan.comm.volume import Volume, overlapped_bytes
from ringzero.plan.comm.network import FEATURES, AlphaBetaGamma

OVERLAP = ("beta", "host_beta")
"""The columns overlapped bytes leave: the slowest rank's bytes, and the bytes of all ranks."""
COLUMNS = [FEATURES.index(k) for k in OVERLAP]
"""Their indices in `plan.comm.network.FEATURES`."""


def overlapped(call, vols: list[Volume]) -> tuple[float, float]:
    """(the most bytes one rank moves behind an earlier segment, all ranks' together): 0 without a
    pipeline. The ranks of a ring move the same bytes up to one element per chunk."""
    per_rank = [overlapped_bytes(call, v) for v in vols]
    return float(max(per_rank, default=0)), float(sum(per_rank))


def overlap_credit(model: AlphaBetaGamma, coefs: dict[str, float] | None, ov) -> float:
    """Seconds the overlapped bytes `ov` (`overlapped`) save against pricing them at β and
    host_beta: (β - beta overlapped)·rank bytes + (host_beta - its overlapped)·all ranks' bytes."""
    if coefs is None:
        return 0.0
    return sum((getattr(model, k) - coefs[k]) * b for k, b in zip(OVERLAP, ov))
