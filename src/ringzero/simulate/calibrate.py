"""Link figures calibrated from two sizes of a published nccl-tests run, and the run checked at the rest.

Two unknowns per link kind, a bandwidth B and a per-message latency α, are fixed by two sizes: the
large one sets B (the time there is bytes / B), the small one α (there the latencies weigh). The
simulated busbw rises with B and falls with α, so each is found by bisection on the simulator
itself, alternating until both sizes agree to 1e-9: no closed form of the algorithm is assumed,
the schedule played is the one the comparison uses. Every other size is then simulated untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ringzero.simulate.collective import bandwidths, simulate
from ringzero.simulate.published import NcclRun
from ringzero.simulate.topology import Topology, preset

LINKS = {"nvlink": ("nvlink_bw", "nvlink_latency"), "nic": ("nic_bw", "nic_latency")}


@dataclass(frozen=True)
class Row:
    nbytes: int
    published: float
    simulated: float
    calibrated: bool
    """Whether this size was one of the two the links were fitted to."""

    @property
    def error(self) -> float:
        return self.simulated / self.published - 1


def busbw(topo: Topology, algorithm: str, nbytes: int) -> float:
    """nccl-tests' busbw (GB/s) of an all-reduce of `nbytes` over every GPU of `topo`."""
    return bandwidths("all_reduce", topo.gpus, nbytes, simulate("all_reduce", algorithm, topo, nbytes).seconds)[1]


def _solve(f, target: float, lo: float, hi: float, rising: bool, log: bool) -> float:
    """x in [lo, hi] with f(x) = target, f monotone (bisection, in log space when `log`)."""
    for _ in range(80):
        mid = math.sqrt(lo * hi) if log else (lo + hi) / 2
        if (f(mid) < target) == rising:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi) if log else (lo + hi) / 2


def fit(run: NcclRun, algorithm: str, at: tuple[int, int], link: str = "nvlink",
        base: Topology | None = None) -> Topology:
    """`base` (default: the run's preset) with `link`'s bandwidth and latency fitted so that the
    simulated busbw equals the published one at the two sizes `at` (small, large)."""
    small, large = sorted(at)
    if link not in LINKS or small == large:
        raise ValueError(f"fit needs two different sizes and a link in {', '.join(LINKS)}")
    bw_key, lat_key = LINKS[link]
    topo = base or preset(run.topology, run.gpus, gpus_per_node=run.gpus_per_node)
    for _ in range(30):
        before = (getattr(topo, bw_key), getattr(topo, lat_key))
        bw = _solve(lambda b: busbw(replace(topo, **{bw_key: b}), algorithm, large), run.at(large),
                    1e8, 1e13, rising=True, log=True)
        topo = replace(topo, **{bw_key: bw})
        lat = _solve(lambda a: busbw(replace(topo, **{lat_key: a}), algorithm, small), run.at(small),
                     0.0, 1e-3, rising=False, log=False)
        topo = replace(topo, **{lat_key: lat})
        if abs(bw / before[0] - 1) < 1e-9 and abs(lat - before[1]) < 1e-12:
            break
    for s in (small, large):
        got = busbw(topo, algorithm, s)
        if abs(got / run.at(s) - 1) > 1e-6:
            # the other links (or the schedule's own shape) bound it: no figure of this link reaches it
            raise ValueError(f"{algorithm} cannot reach the published {run.at(s):.2f} GB/s at {s} bytes by "
                             f"fitting the {link}: it gets at most {got:.2f} GB/s there")
    return topo


def compare(run: NcclRun, topo: Topology, algorithm: str, sizes: list[int],
            calibrated: tuple[int, ...] = ()) -> list[Row]:
    """The published and the simulated busbw at each of `sizes`."""
    return [Row(s, run.at(s), busbw(topo, algorithm, s), s in calibrated) for s in sizes]


def geomean_error(rows: list[Row]) -> float:
    """The geometric mean of |error| over the sizes not calibrated on (ASTRA-sim's figure of merit)."""
    errs = [abs(r.error) for r in rows if not r.calibrated]
    return math.exp(sum(math.log(max(e, 1e-12)) for e in errs) / len(errs)) if errs else 0.0
