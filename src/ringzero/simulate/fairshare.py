"""Max-min fair rates of flows that share links: progressive filling.

Every unfrozen flow's rate rises together; when a link is full, the flows through it freeze at
the rate they have, and the others go on rising over what is left (Bertsekas & Gallager, "Data
Networks", 2nd ed., §6.5.2; the fluid model of SimGrid and floodns). In each round the level is
the smallest fair share, remaining capacity / unfrozen flows, over the links still carrying
unfrozen flows, and every flow through a link at that level freezes: rounds are at most the
number of distinct bottlenecks, usually one or two for a collective's symmetric steps.
"""

from __future__ import annotations

import numpy as np

_TIE = 1e-12
"""Relative tolerance under which two links' fair shares count as the same level."""


def rates(links: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow. `links`: (F, H) link ids per flow, -1 where a route has no
    more hops; `capacity`: (L,) bytes/s. A flow with no link at all gets an infinite rate."""
    f = len(links)
    rate = np.full(f, np.inf)
    if f == 0:
        return rate
    valid = links >= 0
    flow_of = np.nonzero(valid)[0]
    hop = links[valid]
    cap = capacity.astype(float).copy()
    active = np.zeros(f, dtype=bool)
    active[flow_of] = True
    while active.any():
        on = active[flow_of]
        count = np.bincount(hop[on], minlength=len(cap))
        used = count > 0
        share = np.full(len(cap), np.inf)
        share[used] = cap[used] / count[used]
        level = share.min()
        full = used & (share <= level * (1 + _TIE))
        frozen = np.zeros(f, dtype=bool)
        frozen[flow_of[on & full[hop]]] = True
        rate[frozen] = level
        take = frozen[flow_of]
        cap -= np.bincount(hop[take], minlength=len(cap)) * level
        np.maximum(cap, 0.0, out=cap)
        active &= ~frozen
    return rate
