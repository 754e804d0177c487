"""Where the model misses, the measurement: a calibration's correction per (algorithm, world, size).

A model of a few coefficients per algorithm cannot follow every bend a machine's measurements take
(a cache size crossed, a slot ring filled, a thread handed the work), and an `auto` that prices by
the model alone picks the wrong algorithm wherever two of them are close and the model bends the
wrong way. So `cost.fit` keeps, for every measured (collective/algorithm, world, ranks per node),
the ratio measured / predicted at each measured size (the median over the rows of that size,
then over it and its two neighbouring sizes: a running median, so that a single noisy cell does
not decide a pick), and `select` multiplies the model's price by it: at a measured size the price is the measurement, in
between the ratio is interpolated linearly in log(size) (log of the ratio), beyond the measured
sizes the nearest one's ratio holds, and where nothing was measured (another world, another
collective) the model prices alone. This is MPICH's and NCCL's tuning-table idea (measured
thresholds per message size and process count, Thakur, Rabenseifner & Gropp 2005 §5; NCCL's
NCCL_ALGO/NCCL_PROTO tuning files), kept beside a model so that unmeasured calls still get a price.
"""

from __future__ import annotations

import math
from collections import defaultdict


def key(world: int, ranks_per_node: int | None) -> str:
    return f"{world}/{ranks_per_node or world}"


def table(rows: list[dict], predicted: list[float]) -> dict[str, dict[str, list[list[float]]]]:
    """{"collective/algorithm": {"world/ranks per node": [[bytes, ratio], ...] by size}} from measured
    rows and the model's prediction of each (seconds)."""
    ratios: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for row, pred in zip(rows, predicted):
        if pred > 0 and row["time_us"] > 0:
            size = row["count"] * row.get("itemsize", 4)
            ratios[(f"{row['collective']}/{row['algorithm']}", key(row["world"], row.get("ranks_per_node")),
                    size)].append(row["time_us"] * 1e-6 / pred)
    out: dict[str, dict[str, list[list[float]]]] = defaultdict(dict)
    for (alg, where, size), rs in sorted(ratios.items()):
        out[alg].setdefault(where, []).append([float(size), _median(rs)])
    return {alg: {where: _smooth(points) for where, points in worlds.items()} for alg, worlds in out.items()}


def _smooth(points: list[list[float]]) -> list[list[float]]:
    """Each size's ratio as the median of itself and its neighbours' (Tukey's running median of 3):
    one noisy cell no longer decides a pick on its own, while a bend that two sizes show stays."""
    ratios = [r for _, r in points]
    return [[s, _median(ratios[max(0, i - 1):i + 2]) if 0 < i < len(points) - 1 else r]
            for i, (s, r) in enumerate(points)]


def factor(tab: dict, collective: str, algorithm: str, world: int, ranks_per_node: int | None,
           nbytes: int) -> float:
    """The measured / predicted ratio at `nbytes` (1 where nothing was measured)."""
    points = tab.get(f"{collective}/{algorithm}", {}).get(key(world, ranks_per_node))
    if not points or nbytes <= 0:
        return 1.0
    if nbytes <= points[0][0]:
        return points[0][1]
    if nbytes >= points[-1][0]:
        return points[-1][1]
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if s0 <= nbytes <= s1:
            w = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp((1 - w) * math.log(r0) + w * math.log(r1))
    return 1.0


def check(tab) -> dict:
    """`tab` as read from a file, validated (ValueError naming what is wrong)."""
    if not isinstance(tab, dict):
        raise ValueError(f"correction must be an object, got {type(tab).__name__}")
    for alg, worlds in tab.items():
        for where, points in (worlds or {}).items():
            ok = isinstance(points, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and v > 0 for v in p)
                for p in points) and [p[0] for p in points] == sorted({p[0] for p in points})
            if not ok:
                raise ValueError(f"correction {alg} {where}: give [[bytes, ratio > 0], ...] by increasing size")
    return tab


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
