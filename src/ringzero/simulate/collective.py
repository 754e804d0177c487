"""A collective's schedule played on a topology: its time, its bandwidths and its busiest link.

The schedule is the one the algorithm's code runs (`plan.comm.schedule.build`); each step's flows
are routed (`topology.routes`) and played to their end (`fluid.play`), and the steps run one after
another. A step repeated with the same sizes is played once and counted `repeat` times, so a
16,384-GPU ring costs two steps of play, not 2·16,383. A step whose sizes roll (a ring over chunks
of near-equal sizes, counts not divisible by n) is played roll by roll up to `EXACT_ROLLS`
repetitions; beyond, once with every flow at the largest size, which overstates each repetition by
at most one element's time on its slowest link (picoseconds against microseconds), or a latency
where a chunk is empty; `Played.exact` says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ringzero.plan.comm.algorithms import fits, names
from ringzero.plan.comm.schedule.build import schedule_for
from ringzero.plan.comm.schedule.step import Schedule, Step
from ringzero.plan.comm.volume import bus_factor
from ringzero.simulate.fluid import play
from ringzero.simulate.topology import Topology


EXACT_ROLLS = 64
"""Repetitions of a rolling step played one by one; more are played once at the largest size."""


@dataclass(frozen=True)
class Played:
    seconds: float
    link_bytes: np.ndarray
    """(L,) bytes each link carried."""
    steps: int
    plays: int
    """Steps actually played (a repeated step of equal sizes is played once)."""
    exact: bool = True
    """False when a long rolling step was played at its largest size (see the module)."""

    def busiest(self, topo: Topology) -> tuple[str, float]:
        """(link name, utilisation): the link whose bytes / (capacity · time) is highest."""
        if not self.seconds or not self.link_bytes.any():
            return "none", 0.0
        use = self.link_bytes / (topo.capacities() * self.seconds)
        i = int(use.argmax())
        return topo.link_name(i), float(use[i])


Route = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(source GPUs (F,), links (F, 6), latency (F,)) of one step's flows (`Topology.routes`)."""


def route(step: Step, topo: Topology, where: np.ndarray | None = None) -> Route:
    """Step `step`'s flows routed on `topo`, group rank i on GPU where[g, i] for each group g
    (default: GPU i, one group)."""
    src = np.fromiter(step.src, np.int64, len(step.src))
    dst = np.fromiter(step.dst, np.int64, len(step.dst))
    if where is not None:
        src, dst = where[:, src].ravel(), where[:, dst].ravel()
    return (src, *topo.routes(src, dst))


def play_schedule(sched: Schedule, topo: Topology, gpus: Sequence[int] | np.ndarray | None = None,
                  slow: dict[int, float] | None = None, routes: list[Route] | None = None) -> Played:
    """Play `sched` with group rank i on GPU `gpus[i]` (default i). `gpus` may be (G, n): G groups
    running the same call at once (a stage's dp replicas' tp groups), whose flows share the links
    step by step. `slow`: GPU -> factor its sends are stretched by. `routes`: the steps' `route`s
    on every GPU, already made (`auto.lower_bound` makes them)."""
    where = None if gpus is None else np.asarray(gpus, dtype=np.int64).reshape(-1, sched.call.n)
    groups = 1 if where is None else len(where)
    cap = topo.capacities()
    carried = np.zeros(len(cap))
    total, plays, count, exact = 0.0, 0, 0, True
    for j, step in enumerate(sched.steps):
        src, links, latency = routes[j] if routes is not None and where is None else route(step, topo, where)
        factor = None if not slow else np.array([slow.get(int(g), 1.0) for g in src])
        sizes = np.fromiter(step.nbytes, float, len(step.nbytes))
        valid = links >= 0
        hops = np.broadcast_to(np.arange(len(src))[:, None], links.shape)[valid]
        once = step.uniform or step.repeat > EXACT_ROLLS
        if not step.uniform and once:
            sizes, exact = np.full(len(sizes), sizes.max()), False
        for i in (range(1) if once else range(step.repeat)):
            now = np.tile(np.roll(sizes, i * step.roll) if i else sizes, groups)
            got = play(links, latency, now, cap, factor)
            times = step.repeat if once else 1
            total += got.seconds * times
            carried += np.bincount(links[valid], weights=now[hops], minlength=len(cap)) * times
            plays += 1
        count += step.repeat
    return Played(total, carried, count, plays, exact)


def simulate(collective: str, algorithm: str, topo: Topology, nbytes: int, itemsize: int = 4,
             slow: dict[int, float] | None = None) -> Played:
    """`collective` of a `nbytes` buffer over every GPU of `topo` with `algorithm` (`slow`: as
    `play_schedule`)."""
    return play_schedule(schedule_for(collective, algorithm, topo.gpus, nbytes // itemsize, itemsize, 0,
                                      topo.gpus_per_node), topo, slow=slow)


def candidates(collective: str, topo: Topology) -> list[str]:
    """The algorithms "auto" weighs for `collective` on every GPU of `topo`."""
    return [a for a in names(collective) if fits(a, topo.gpus, topo.gpus_per_node)]


def bandwidths(collective: str, n: int, nbytes: int, seconds: float) -> tuple[float, float]:
    """nccl-tests' (algbw, busbw) in GB/s (1e9 bytes/s)."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * bus_factor(collective, n)
