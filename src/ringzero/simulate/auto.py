""""auto": the fastest algorithm of a collective, found by playing as few schedules as it takes.

Playing every candidate's schedule and keeping the fastest is exact but pays for every play; at
16,384 GPUs most candidates are far from the winner (a ring's 32,766 latencies against a
Rabenseifner's 28). So each built schedule is first priced by a lower bound of its play
(`lower_bound`, one pass over its flows with no rate sharing), candidates are played in the order of
their bounds, and one whose bound is above the fastest time played so far is not played at all:
it cannot win. The answer is the one playing all of them gives (ties go, as before, to the first
in the collective's list of algorithms); `Fastest.played` says which were played. Branch and bound
(Land & Doig 1960) over the simulator's own schedules, with the fluid model's bounds as the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringzero.plan.comm.schedule.build import schedule_for
from ringzero.plan.comm.schedule.step import Schedule
from ringzero.simulate.collective import Played, Route, play_schedule, route
from ringzero.simulate.topology import Topology


def lower_bound(sched: Schedule, topo: Topology) -> tuple[float, list[Route]]:
    """(seconds no play of `sched` on every GPU of `topo` can beat, stragglers or not; the steps'
    routes, for the play). In the fluid model (`fluid.play`) a step ends with its last arrival, and
    for every flow that is at least its latency plus its bytes at the least capacity on its route,
    and for every link at least its bytes over its capacity plus the least latency of the step; a
    rolled step is bounded at its smallest size, which every repetition's flows carry at least."""
    cap = topo.capacities()
    total, routes = 0.0, []
    for step in sched.steps:
        routes.append(route(step, topo))
        _, links, latency = routes[-1]
        sizes = np.fromiter(step.nbytes, float, len(step.nbytes))
        if not len(sizes) or not sizes.any():
            continue
        if not step.uniform:
            sizes = np.full(len(sizes), sizes.min())
        valid = links >= 0
        slowest = np.where(valid, cap[np.where(valid, links, 0)], np.inf).min(axis=1)
        flow = np.where(sizes > 0, latency + sizes / slowest, 0.0).max()
        load = np.bincount(links[valid], weights=np.broadcast_to(sizes[:, None], links.shape)[valid],
                           minlength=len(cap)) / cap
        total += max(flow, load.max() + latency[sizes > 0].min(initial=np.inf)) * step.repeat
    return total, routes


@dataclass(frozen=True)
class Fastest:
    algorithm: str
    played: Played
    bounds: dict[str, float]
    """Algorithm -> its lower bound, every candidate."""
    compared: tuple[str, ...]
    """The candidates actually played, in the order they were."""


def fastest(collective: str, algorithms: list[str], topo: Topology, nbytes: int, itemsize: int = 4,
            slow: dict[int, float] | None = None) -> Fastest:
    """The fastest of `algorithms` for `collective` of `nbytes` on every GPU of `topo` (`slow`: as
    `play_schedule`), playing only the candidates whose lower bound does not rule them out."""
    scheds = {a: schedule_for(collective, a, topo.gpus, nbytes // itemsize, itemsize, 0, topo.gpus_per_node)
              for a in algorithms}
    priced = {a: lower_bound(s, topo) for a, s in scheds.items()}
    bounds = {a: b for a, (b, _) in priced.items()}
    best: tuple[float, int, str] | None = None
    played: dict[str, Played] = {}
    for a in sorted(algorithms, key=lambda a: (bounds[a], algorithms.index(a))):
        if best is not None and bounds[a] > best[0]:
            break                                          # sorted: no later one can win either
        played[a] = play_schedule(scheds[a], topo, slow=slow, routes=priced[a][1])
        best = min(best or (np.inf, 0, a), (played[a].seconds, algorithms.index(a), a))
    return Fastest(best[2], played[best[2]], bounds, tuple(played))
