"""The recursive algorithms' schedules (butterfly, Rabenseifner, recursive doubling and halving)
computed round by round, without listing each rank's messages.

The algorithms of `plan.comm.links_recursive` (Thakur, Rabenseifner & Gropp 2005 §3.1, §4.1,
§4.2, with MPICH's fold of the ranks beyond the largest power of two p): the even ranks of the
first 2·rem (rem = n - p) hand their buffer to the odd one above them ("fold_in"), the p survivors
exchange with survivor v XOR mask in log2 p rounds of recursive halving ("halve", masks p/2 .. 1)
and/or doubling ("double", masks 1 .. p/2), and the keepers hand the result back ("fold_out").

Steps are numbered by `asap`'s rule, applied to the survivors directly: a rank posts its first
round at step 1 (a keeper its first exchange at step 2, after its fold_in), an exchange goes at the
later of the two partners' posts, and each partner posts its next round one step after it. With
no fold every round is one step of p flows; with one, plain survivors run a round ahead of the
keepers until they meet one, which the recurrence follows. p integers per round instead of
`asap`'s objects per message: a 16,384-rank Rabenseifner is built in a fraction of a second, not
tens of seconds. Exact when every chunk holds an element (count >= n: no message is empty), which
`build.built` requires; the tests hold the result equal to `asap`'s listing message by message.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from itertools import chain

from ringzero.plan.comm.chunks import Chunks, pof2_floor
from ringzero.plan.comm.schedule.step import Schedule, Step, check_size, compress
from ringzero.plan.comm.volume import Call
from ringzero.plan.comm.volumes.butterfly import first_rank

PHASES = {"butterfly": ("double",), "rabenseifner": ("halve", "double"), "recursive_doubling": ("double",),
          "recursive_halving": ("halve",)}
"""Algorithm -> its survivors' phases, in the order they run."""


def flows(call: Call) -> int:
    """Flows the schedule holds: two per fold pair, p per survivor round."""
    p = pof2_floor(call.n)
    rem = call.n - p
    pieces = 3 if call.algorithm == "recursive_doubling" else 2      # all_gather hands back two parts
    return pieces * rem + len(PHASES[call.algorithm]) * (p.bit_length() - 1) * p


def _survivor_bounds(call: Call, p: int, rem: int) -> list[int]:
    """Offset (elements) of survivor block u, u = 0..p: Rabenseifner cuts the buffer into p near-equal
    blocks of its own; the others use the ranks' chunks, a folded pair's two as one block."""
    if call.algorithm == "rabenseifner":
        b = Chunks(call.count, p).bound
        return [b(u) for u in range(p + 1)]
    b = call.chunks.bound
    return [b(first_rank(u, rem)) if u < p else b(call.n) for u in range(p + 1)]


@lru_cache(maxsize=256)
def _peers(p: int, mask: int) -> tuple[int, ...]:
    """(v XOR mask for v < p; mask 0: v): blocks of mask survivors swapped pairwise, built by
    ranges (the same tuple for every size, phase and call of p survivors)."""
    if not mask:
        return tuple(range(p))
    return tuple(chain.from_iterable(r for b in range(0, p, 2 * mask)
                                     for r in (range(b + mask, b + 2 * mask), range(b, b + mask))))


def _round(phase: str, mask: int, p: int, bounds: list[int], block: int, whole: int, k: int
           ) -> tuple[tuple[int, ...], list[int]]:
    """(partner, bytes sent) of every survivor v in the round of `mask`: the butterfly sends its
    whole buffer; halving gives away the half of its range it does not keep (the survivors whose
    block starts at (v XOR mask) with the bits below mask cleared); doubling sends the block of mask
    survivors it holds (starting at v with those bits cleared). `block`: the elements of every
    survivor block when they are all equal (0 otherwise)."""
    low = ~(mask - 1)
    peer = _peers(p, mask)
    if whole:
        return peer, [whole] * p
    if block:                                             # equal blocks: every survivor sends mask of them
        return peer, [mask * block * k] * p
    start = [w & low for w in peer] if phase == "halve" else [v & low for v in range(p)]
    return peer, [(bounds[s + mask] - bounds[s]) * k for s in start]


def _masks(phase: str, p: int) -> list[int]:
    masks = [1 << i for i in range(p.bit_length() - 1)]
    return masks[::-1] if phase == "halve" else masks


def _folds(call: Call, rem: int, k: int) -> tuple[list[int], list[list[int]]]:
    """(bytes each folded rank 2i hands to 2i + 1, the bytes 2i + 1 hands back, in order)."""
    s, b, sizes = call.count * k, call.chunks.bound, call.sizes
    if call.algorithm == "recursive_doubling":                    # its chunk in; everyone else's back
        return [sizes[2 * i] * k for i in range(rem)], [[b(2 * i) * k, (b(call.n) - b(2 * i + 1)) * k] for i in range(rem)]
    if call.algorithm == "recursive_halving":                     # its buffer in; its chunk back
        return [s] * rem, [[sizes[2 * i] * k] for i in range(rem)]
    return [s] * rem, [[s] for _ in range(rem)]


def recursive(call: Call) -> Schedule:
    n, k = call.n, call.itemsize
    p = pof2_floor(n)
    rem = n - p
    check_size(flows(call), f"{call.collective} with {call.algorithm} on {n:,} ranks")
    real = [2 * v + 1 if v < rem else v + rem for v in range(p)]
    bounds = _survivor_bounds(call, p, rem)
    whole = call.count * k if call.algorithm == "butterfly" else 0
    block = bounds[1] if all(bounds[u] == u * bounds[1] for u in range(p + 1)) else 0
    rounds = [(phase, mask) for phase in PHASES[call.algorithm] for mask in _masks(phase, p)]
    if not rem:                    # every survivor in step: round j is step j, flows by sender
        steps = []
        for phase, mask in rounds:
            peer, sent = _round(phase, mask, p, bounds, block, whole, k)
            steps.append(Step(_peers(p, 0), peer, tuple(sent), (1,) * p, tag=phase))
        return Schedule(call, tuple(compress(steps)))
    at: dict[int, list] = defaultdict(list)        # step -> (src, order, dst, bytes, tag)
    given, back = _folds(call, rem, k)
    for i in range(rem):
        at[1].append((2 * i, 0, 2 * i + 1, given[i], "fold_in"))
    post = [2 if v < rem else 1 for v in range(p)]
    for phase, mask in rounds:
        peer, sent = _round(phase, mask, p, bounds, block, whole, k)
        meet = [max(post[v], post[w]) for v, w in enumerate(peer)]
        for v in range(p):
            at[meet[v]].append((real[v], 0, real[peer[v]], sent[v], phase))
        post = [m + 1 for m in meet]
    for i in range(rem):
        for j, nbytes in enumerate(back[i]):
            if nbytes:
                at[post[i]].append((2 * i + 1, j, 2 * i, nbytes, "fold_out"))
    steps = []
    for step in sorted(at):
        ms = sorted(at[step])
        steps.append(Step(tuple(m[0] for m in ms), tuple(m[2] for m in ms), tuple(m[3] for m in ms),
                          (1,) * len(ms), tag=ms[0][4]))
    if len(steps) != max(at):
        raise AssertionError(f"{call.algorithm} leaves a step with no message: steps {sorted(at)}")
    return Schedule(call, tuple(compress(steps)))


BUILDERS = {name: recursive for name in PHASES}
