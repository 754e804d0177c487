"""The naive algorithm's schedule written down at once: every rank to the root, then the root to
every rank (`plan.comm.links`' "up" and "down", `ringzero.comm.algorithms.naive`).

Each rank's "up" is one round and the root's is one round too (it takes all n-1 messages in it),
so by `asap`'s rule every "up" message goes at step 1 and every "down" one at step 2 (step 1 for a
collective with no "up"); the flows are in sender order, as `asap` lists them. Two steps of n-1
flows, not n-1 objects per rank walked by `asap`: a 16,384-rank all-reduce in milliseconds. Exact
when no chunk is empty (count >= n), which `build.built` requires; the tests hold it equal to the
listing. all_to_all, whose messages are its matrix's, stays listed.
"""

from __future__ import annotations

from ringzero.plan.comm.links import _DOWN, _UP
from ringzero.plan.comm.schedule.step import Schedule, Step, check_size
from ringzero.plan.comm.volume import ROOTED, Call


def naive(call: Call) -> Schedule:
    n, k, c = call.n, call.itemsize, call.collective
    check_size(2 * (n - 1), f"{c} with naive on {n:,} ranks")
    root = call.root if c in ROOTED else 0
    others = tuple(r for r in range(n) if r != root)
    steps = []
    for tag, table in (("up", _UP), ("down", _DOWN)):
        if c in table:
            sizes = tuple((call.count if table[c] == "whole" else call.sizes[r]) * k for r in others)
            ends = (others, (root,) * len(others)) if tag == "up" else ((root,) * len(others), others)
            steps.append(Step(*ends, sizes, (1,) * len(others), tag=tag))
    return Schedule(call, tuple(steps))
