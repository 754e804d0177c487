"""One step of concurrent flows played to its end.

All flows of a step start together. Each gets its max-min fair rate (`fairshare.rates`); when
the first ones have delivered their bytes they leave and the rest are re-shared, until none is
left. A flow's time is its latency plus the time its bytes needed at the rates it got as the
others finished; the step ends with its last flow (the synchronous model of a collective's
dependent rounds, `plan.comm.schedule.step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringzero.simulate.fairshare import rates

_DONE = 1e-9
"""Bytes below which a flow counts as delivered (float rounding of rate x time)."""


@dataclass(frozen=True)
class Played:
    seconds: float
    """When the step's last flow arrived."""
    finish: np.ndarray
    """(F,) each flow's arrival, seconds from the step's start."""
    events: int
    """Rate re-shares the step needed (1 when every flow ends at once)."""


def play(links: np.ndarray, latency: np.ndarray, nbytes: np.ndarray, capacity: np.ndarray,
         slow: np.ndarray | None = None) -> Played:
    """Play flows (`links` (F, H), `latency` (F,) s, `nbytes` (F,)) over links of `capacity`.
    `slow` (F,): a factor each flow's time is stretched by on its own (a straggling sender)."""
    f = len(nbytes)
    left = nbytes.astype(float).copy()
    finish = np.zeros(f)
    live = left > 0
    t, events = 0.0, 0
    while live.any():
        idx = np.nonzero(live)[0]
        r = rates(links[idx], capacity)
        if slow is not None:
            r = r / slow[idx]
        need = np.where(np.isinf(r), 0.0, left[idx] / r)
        dt = need.min()
        t += dt
        events += 1
        left[idx] -= np.where(np.isinf(r), left[idx], r * dt)
        done = left[idx] <= _DONE * np.maximum(1.0, nbytes[idx])
        finish[idx[done]] = t
        live[idx[done]] = False
    arrive = np.where(nbytes > 0, finish + latency, 0.0)
    return Played(float(arrive.max(initial=0.0)), arrive, events)
