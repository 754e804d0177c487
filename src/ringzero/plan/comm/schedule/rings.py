"""The ring-based algorithms' schedules in compressed form: a ring phase of n-1 steps is one `Step`.

At step s of a ring phase every member r sends chunk (r + shift - s) mod n to r + 1
(Patarasuk & Yuan 2009; `ringzero.comm.algorithms.ring`), so the n-1 steps differ only by a roll
of the chunk sizes: one step of n flows, repeated n-1 times with `roll` 1 (and no roll at all when
the chunks are equal, the common case, which a simulator then prices once). Steps are numbered
as `schedule.asap` numbers them; the tests hold the two forms equal message by message.

- ring all_reduce, reduce_scatter, all_gather: one or two phases over the whole group;
- hierarchical all_reduce (Jia et al. 2018): the binomial reduce inside each block of
  `node_size` ranks and the broadcast back are few messages and come from `asap`; the leaders'
  ring between them is compressed;
- hierarchical_2d all_reduce (Mikami et al. 2018): the reduce-scatter inside every node (all nodes
  at once), the rings of equal local index across nodes, the all-gather inside every node;

The hierarchical forms are exact when every chunk holds an element (count >= n); with fewer, the
ranks of empty chunks run ahead and `asap` lists the (few) messages instead (`build.schedule`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ringzero.plan.comm.chunks import Chunks, n_segments
from ringzero.plan.comm.schedule import asap
from ringzero.plan.comm.schedule.step import Schedule, Step, check_size, compress
from ringzero.plan.comm.volume import Call
from ringzero.plan.comm.volumes.hierarchical_2d import node_count

_SHIFTS = {"all_reduce": (0, 1), "reduce_scatter": (-1,), "all_gather": (0,)}


def ring_phase(rings: Sequence[Sequence[int]], sizes: Sequence, shift: int, itemsize: int, seg: int,
               tag: str) -> list[Step]:
    """One ring phase run by every ring of `rings` at once (group ranks, in ring order), each
    over chunks `sizes[i]` of its own (the same length as the ring): n-1 steps as one `Step`.
    Repetition s (0-based) holds member p sending chunk (p + shift - s) of its ring."""
    flows = sum(len(members) for members in rings)
    check_size(flows, f"a ring phase of {flows:,} flows")
    src, dst, nbytes, pieces = [], [], [], []
    for members, chunk in zip(rings, sizes):
        n = len(members)
        values = list(chunk)                 # one pass (a `Chunks` divides once), not n lookups
        sent = [values[(p + shift) % n] for p in range(n)]
        segments = {z: n_segments(z, seg) for z in set(sent)}
        src.extend(members)
        dst.extend(members[p] for p in range(1, n))
        dst.append(members[0])
        nbytes.extend(z * itemsize for z in sent)
        pieces.extend(segments[z] for z in sent)
    n = len(rings[0]) if rings else 1
    if n < 2 or not any(nbytes):
        return []
    even = all(len(c.histogram()) <= 1 for c in _distinct(sizes))
    return [Step(tuple(src), tuple(dst), tuple(nbytes), tuple(pieces), repeat=n - 1, roll=0 if even else 1, tag=tag)]


def _distinct(sizes: Sequence) -> list:
    """Each distinct chunk list once (every node's ring of hierarchical_2d shares one `Chunks`)."""
    out = []
    for c in sizes:
        if not any(c is d or c == d for d in out):
            out.append(c)
    return out


def _rolled_ok(rings: Sequence[Sequence[int]]) -> bool:
    """`Step.roll` rolls the whole flow list by one place, which is each ring's own roll only when
    there is one ring (several rings of equal chunks need no roll at all)."""
    return len(rings) == 1


def _phases(rings, sizes, shifts, itemsize, seg, tag) -> list[Step]:
    out = []
    for shift in shifts:
        steps = ring_phase(rings, sizes, shift, itemsize, seg, tag)
        if steps and not _rolled_ok(rings) and not steps[0].uniform:
            steps = _unrolled(rings, sizes, shift, itemsize, seg, tag)
        out += steps
    return out


def _unrolled(rings, sizes, shift, itemsize, seg, tag) -> list[Step]:
    """Several rings of uneven chunks: each of the n-1 steps listed (each ring rolls on its own)."""
    n = len(rings[0])
    check_size(len(rings) * n * (n - 1), f"{len(rings)} rings of {n} uneven chunks")
    steps = []
    for s in range(n - 1):
        flows = [(m[p], m[(p + 1) % n], c[(p + shift - s) % n]) for m, c in zip(rings, sizes) for p in range(n)]
        steps.append(Step(tuple(f[0] for f in flows), tuple(f[1] for f in flows),
                          tuple(f[2] * itemsize for f in flows),
                          tuple(n_segments(f[2], seg) for f in flows), tag=tag))
    return steps


def ring(call: Call) -> Schedule:
    n = call.n
    steps = _phases([range(n)], [call.chunks], _SHIFTS[call.collective], call.itemsize, call.segment_elems, "ring")
    return Schedule(call, tuple(steps))


def hierarchical(call: Call) -> Schedule:
    """The block-local binomial phases from `asap` around the compressed leaders' ring."""
    k = call.node_size
    if call.n <= k:                                       # one block: a binomial tree, no ring
        return asap.schedule(call)
    local = _blocks(call, "up"), _blocks(call, "down")
    leaders = list(range(0, call.n, k))
    ring_steps = _phases([leaders], [Chunks(call.count, len(leaders))], (0, 1), call.itemsize,
                         call.segment_elems, "leaders")
    return Schedule(call, tuple(local[0]) + tuple(ring_steps) + tuple(local[1]))


def _blocks(call: Call, phase: str) -> list[Step]:
    """Every block's binomial reduce ("up") or broadcast ("down") at once: one block's steps from
    `asap` (blocks are alike, so a 16,384-rank group lists 8 ranks' messages, not all of theirs),
    repeated at each block's offset, the shorter last block beside the others from step 1."""
    k, n = call.node_size, call.n
    other = "down" if phase == "up" else "up"
    shapes = {}
    for size in {k, n % k} - {0, 1}:
        block = replace(call, n=size, sizes=Chunks(call.count, size), ranks_per_node=size)
        shapes[size] = [x for s in asap.schedule(block, drop=(other,)).steps for x in _expand(s)]
    firsts = [(f, min(k, n - f)) for f in range(0, n, k)]
    depth = max((len(v) for v in shapes.values()), default=0)
    steps = []
    for i in range(depth):
        flows = [(f + a, f + b, z, p) for f, size in firsts if i < len(shapes.get(size, ()))
                 for a, b, z, p in shapes[size][i]]
        steps.append(Step(*map(tuple, zip(*flows)), tag=phase))
    return steps


def _expand(s: Step) -> list[list[tuple[int, int, int, int]]]:
    """A step's repetitions, each as its (src, dst, nbytes, pieces) flows."""
    out = []
    for i in range(s.repeat):
        sizes, pieces = s.sizes_at(i)
        out.append(list(zip(s.src, s.dst, sizes, pieces)))
    return out


def hierarchical_2d(call: Call) -> Schedule:
    k, m = node_count(call)
    nodes = [range(f, f + k) for f in range(0, call.n, k)]
    pieces = Chunks(call.count, k)
    args = (call.itemsize, call.segment_elems)
    steps = _phases(nodes, [pieces] * m, (-1,), *args, "node_rs")
    if m > 1:
        cross = [range(i, call.n, k) for i in range(k)]
        steps += _phases(cross, [Chunks(pieces[i], m) for i in range(k)], (0, 1), *args, "cross")
    steps += _phases(nodes, [pieces] * m, (0,), *args, "node_ag")
    return Schedule(call, tuple(steps))


BUILDERS = {"ring": ring, "hierarchical": hierarchical, "hierarchical_2d": hierarchical_2d}
