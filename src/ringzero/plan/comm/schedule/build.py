"""The schedule of any call: built directly where a builder has its exact form, listed otherwise.

`schedule(call)` is what the simulator plays. The ring is compressed for every count, the
hierarchical all-reduces when every chunk is non-empty (`rings`); the tree's whole-buffer
collectives are computed along the tree (`tree`); the recursive algorithms (butterfly,
Rabenseifner, recursive doubling and halving) round by round (`recursive`) and naive's two steps
at once (`naive`), when every chunk is non-empty; the rest (pairwise, scatter_allgather, the
tree's gather and scatter, every algorithm on fewer elements than ranks), whose steps overlap
phases on ranks that finish early, are listed by `asap` after checking that their messages fit
`MAX_LISTED`.
`schedule_for` checks that bound before a call is even made: an all-to-all's call holds its n×n
matrix.
"""

from __future__ import annotations

from ringzero.plan.comm.schedule import asap, naive, recursive, rings, tree
from ringzero.plan.comm.schedule.step import Schedule, check_size
from ringzero.plan.comm.volume import Call, call_for, volume

BUILDERS = {**rings.BUILDERS, "tree": tree.tree, **recursive.BUILDERS, "naive": naive.naive}
"""Algorithm -> the builder of its schedule without listing every message."""


def built(call: Call) -> bool:
    """Whether `BUILDERS` has `call`'s exact form."""
    if call.algorithm == "ring":
        return True
    if call.algorithm == "tree":
        return call.collective in tree.WHOLE and call.count > 0 and call.n > 1
    if call.algorithm == "naive":
        return call.collective != "all_to_all" and call.count >= call.n
    return call.algorithm in BUILDERS and call.count >= call.n


MAX_LISTED = 1_000_000
"""Messages `asap` may list: each is a few Python objects (about 1 GB at this bound), so a listed
schedule is held to a twentieth of what a compressed one may store."""


def messages_in(call: Call, bound: int = MAX_LISTED) -> int:
    """Messages of `call` over all ranks, counted rank by rank from the volume formulas and stopped
    as soon as they pass `bound` (an all-to-all's n(n-1) from its size alone)."""
    if call.collective == "all_to_all":
        return call.n * (call.n - 1)
    total = 0
    for r in range(call.n):
        total += volume(call, r).messages_sent
        if total > bound:
            break
    return total


def check(call: Call) -> None:
    """Refuse `call` if its schedule would not fit the simulator's bounds (`step.check_size`)."""
    what = f"{call.collective} with {call.algorithm} on {call.n:,} ranks"
    if built(call) and call.algorithm in recursive.BUILDERS:
        check_size(recursive.flows(call), what)
    elif built(call):
        check_size(call.n, what, at_least=True)          # every builder stores a flow per rank
    else:
        check_size(messages_in(call), what, MAX_LISTED, at_least=call.collective != "all_to_all")


def schedule(call: Call) -> Schedule:
    check(call)
    return BUILDERS[call.algorithm](call) if built(call) else asap.schedule(call)


def call_checked(collective: str, algorithm: str, n: int, count: int, itemsize: int = 4, root: int = 0,
                 ranks_per_node: int | None = None) -> Call:
    """`call_for(...)` once its schedule is known to fit: an all-to-all's call holds its n×n matrix,
    so that one is refused from its size before the call is made."""
    if collective == "all_to_all":
        check_size(n * (n - 1), f"all_to_all with {algorithm} on {n:,} ranks", MAX_LISTED)
    call = call_for(collective, algorithm, n, count, itemsize, root, ranks_per_node)
    check(call)
    return call


def schedule_for(collective: str, algorithm: str, n: int, count: int, itemsize: int = 4, root: int = 0,
                 ranks_per_node: int | None = None) -> Schedule:
    """The schedule of `call_checked(...)`."""
    call = call_checked(collective, algorithm, n, count, itemsize, root, ranks_per_node)
    return BUILDERS[call.algorithm](call) if built(call) else asap.schedule(call)
