"""Which bytes of a collective cross nodes, and how long an emulated inter-node link takes for them.

The twin of the traffic meter's `cross_node_bytes_sent` / `cross_node_bytes_recv` and of the link
emulator (`ringzero.comm.link_emulator`). A node is `ranks_per_node` consecutive *global* ranks
(global rank g lives on node g // ranks_per_node), and a group's rank i is global rank `ranks[i]`,
so a group such as global ranks [1, 3, 5, 7] can have every ring edge cross nodes while the prefix
group [0..7] has only one in four.

Bytes per node pair depend on who sends to whom, not only on how much each rank sends, so every
supported algorithm is written here as its list of messages, step by step, mirroring its code in
`ringzero.comm.algorithms`:

- ring (all_reduce, all_gather, reduce_scatter; Patarasuk & Yuan 2009): at step s of a phase
  rank r sends chunk (r + shift - s) to r + 1 and receives chunk (r + shift - s - 1) from r - 1,
  each chunk cut into `call.segment_bytes` pieces (`plan.comm.volumes.ring`);
- naive (every collective): straight to and from the root, rank 0 for the all-* collectives
  (`plan.comm.volumes.naive`), and every pair at once for all_to_all;
- pairwise all_to_all: at step s, to and from `schedules.peers(n, r, s)` (Thakur, Rabenseifner &
  Gropp 2005 §3.6);
- hierarchical all_reduce (Jia et al. 2018): a binomial reduce and broadcast inside each block of
  `call.node_size` group ranks, and the ring among the blocks' first ranks. The blocks follow the
  group ranks, as the algorithm does; whether a message crosses nodes follows the global ranks.
- hierarchical_2d all_reduce (Mikami et al. 2018): a ring reduce-scatter inside each block, the
  ring all-reduce of piece i among the blocks' ranks i, a ring all-gather inside each block.
- the binomial trees, the butterfly, recursive doubling and halving, Rabenseifner and the van de
  Geijn broadcast's scatter: `plan.comm.links_recursive`.

Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ringzero.plan.comm import links_recursive
from ringzero.plan.comm.algorithms import ALGORITHMS
from ringzero.plan.comm.chunks import Chunks, n_segments
from ringzero.plan.comm.volume import ROOTED, Call
from ringzero.plan.comm.schedules import peers
from ringzero.plan.comm.volumes.hierarchical_2d import node_count
from ringzero.plan.comm.volumes.tree import _top


@dataclass(frozen=True)
class Message:
    """One message of a collective: `nbytes` from group rank `src` to `dst` at `step`, in `pieces`
    wire messages (the ring's segments). `step` names a step of the algorithm the same way on
    every rank, so that the messages of one step can be set side by side."""

    step: tuple
    src: int
    dst: int
    nbytes: int
    pieces: int = 1


def _ring(sizes, members: Sequence[int], pos: int, shifts: Sequence[int], itemsize: int, seg: int,
          tag: str = "ring") -> Iterator[Message]:
    """The ring phases `shifts` (-1: reduce-scatter, 0 and 1: all-reduce's two halves, 0: all-gather)
    over group ranks `members`, seen from position `pos`: chunks of `sizes`, right = pos + 1."""
    n = len(members)
    me, right, left = members[pos], members[(pos + 1) % n], members[(pos - 1) % n]
    for shift in shifts:
        for s in range(n - 1):
            out, inc = sizes[(pos + shift - s) % n], sizes[(pos + shift - s - 1) % n]
            if out:
                yield Message((tag, shift, s), me, right, out * itemsize, n_segments(out, seg))
            if inc:
                yield Message((tag, shift, s), left, me, inc * itemsize, n_segments(inc, seg))


_RING_SHIFTS = {"all_reduce": (0, 1), "reduce_scatter": (-1,), "all_gather": (0,)}


def _ring_messages(call: Call, rank: int) -> Iterator[Message]:
    yield from _ring(call.chunks, range(call.n), rank, _RING_SHIFTS[call.collective], call.itemsize,
                     call.segment_elems)


_UP = {"reduce": "whole", "all_reduce": "whole", "reduce_scatter": "whole", "gather": "chunk",
       "all_gather": "chunk"}
"""Naive's first step, every rank to the root: its whole buffer, or its own chunk."""
_DOWN = {"broadcast": "whole", "all_reduce": "whole", "all_gather": "whole", "scatter": "chunk",
         "reduce_scatter": "chunk"}
"""Naive's last step, the root to every rank: the whole buffer, or that rank's chunk."""


def _naive_messages(call: Call, rank: int) -> Iterator[Message]:
    n, k, c = call.n, call.itemsize, call.collective
    if c == "all_to_all":
        for j in range(n):
            if j != rank:
                yield Message(("all",), rank, j, call.matrix[rank][j] * k)
                yield Message(("all",), j, rank, call.matrix[j][rank] * k)
        return
    root = call.root if c in ROOTED else 0
    others = [p for p in range(n) if p != root] if rank == root else [rank]
    for step, table in (("up", _UP), ("down", _DOWN)):
        if c in table:
            for p in others:
                size = call.count if table[c] == "whole" else call.sizes[p]
                src, dst = (p, root) if step == "up" else (root, p)
                yield Message((step,), src, dst, size * k)


def _pairwise_messages(call: Call, rank: int) -> Iterator[Message]:
    for s in range(1, call.n):
        dst, src = peers(call.n, rank, s)
        yield Message(("pair", s), rank, dst, call.matrix[rank][dst] * call.itemsize)
        yield Message(("pair", s), src, rank, call.matrix[src][rank] * call.itemsize)


def _hierarchical_messages(call: Call, rank: int) -> Iterator[Message]:
    n, k, nbytes = call.n, call.node_size, call.count * call.itemsize
    first = rank - rank % k
    vr, size = rank - first, min(first + k, n) - first
    for b in range(_top(vr, size)):  # binomial tree to the block's first rank, then back
        if vr + (1 << b) < size:
            child = first + vr + (1 << b)
            yield Message(("up", b), child, rank, nbytes)
            yield Message(("down", b), rank, child, nbytes)
    if vr:
        b = _top(vr, size)
        parent = first + vr - (1 << b)
        yield Message(("up", b), rank, parent, nbytes)
        yield Message(("down", b), parent, rank, nbytes)
    elif n > k:
        leaders = range(0, n, k)
        yield from _ring(Chunks(call.count, len(leaders)), leaders, rank // k, (0, 1), call.itemsize,
                         call.segment_elems, tag="leaders")


def _hierarchical_2d_messages(call: Call, rank: int) -> Iterator[Message]:
    k, m = node_count(call)
    first, local = rank - rank % k, rank % k
    node, pieces = range(first, first + k), Chunks(call.count, k)
    yield from _ring(pieces, node, local, (-1,), call.itemsize, call.segment_elems, tag="node_rs")
    if m > 1:
        yield from _ring(Chunks(pieces[local], m), range(local, call.n, k), rank // k, (0, 1),
                         call.itemsize, call.segment_elems, tag="cross")
    yield from _ring(pieces, node, local, (0,), call.itemsize, call.segment_elems, tag="node_ag")


def _scatter_allgather_messages(call: Call, rank: int) -> Iterator[Message]:
    yield from (Message(*m) for m in links_recursive.binomial_scatter(call, rank))
    yield from _ring(call.chunks, range(call.n), rank, (-call.root,), call.itemsize, call.segment_elems)


def _recursive(name: str) -> Callable[[Call, int], Iterator[Message]]:
    return lambda call, rank: (Message(*m) for m in links_recursive.SCHEDULES[name](call, rank))


_SCHEDULES: dict[str, Callable[[Call, int], Iterator[Message]]] = {
    "ring": _ring_messages, "naive": _naive_messages, "pairwise": _pairwise_messages,
    "hierarchical": _hierarchical_messages, "hierarchical_2d": _hierarchical_2d_messages,
    "scatter_allgather": _scatter_allgather_messages,
    **{name: _recursive(name) for name in links_recursive.SCHEDULES}}
"""Algorithm -> its messages, for every collective of `plan.comm.algorithms` that has the algorithm."""


def modelled(collective: str) -> tuple[str, ...]:
    """The algorithms of `collective` whose cross-node traffic this module knows."""
    return tuple(a for a in ALGORITHMS.get(collective, {}) if a in _SCHEDULES)


def messages(call: Call, rank: int) -> list[Message]:
    """Every message group rank `rank` sends or receives in `call` (zero-byte ones left out, as the
    collectives never send them). Raises ValueError for an algorithm this module does not model,
    "torch" included: the backend's own collectives are not seen message by message."""
    if call.algorithm not in modelled(call.collective):
        raise ValueError(f"no cross-node traffic model for {call.collective} with algorithm "
                         f"{call.algorithm!r}; modelled: {', '.join(modelled(call.collective)) or 'none'}")
    if not 0 <= rank < call.n:
        raise ValueError(f"rank {rank} is not in a group of {call.n}")
    if call.n == 1 or call.count == 0:
        return []
    return [m for m in _SCHEDULES[call.algorithm](call, rank) if m.nbytes]


def _node_of(call: Call, ranks: Sequence[int], ranks_per_node: int | None) -> Callable[[int], int]:
    if len(ranks) != call.n:
        raise ValueError(f"ranks lists {len(ranks)} global ranks for a group of {call.n}")
    if ranks_per_node is not None and ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1 or None, got {ranks_per_node}")
    k = ranks_per_node
    return (lambda i: 0) if k is None else (lambda i: ranks[i] // k)


def cross_node_bytes(call: Call, rank: int, ranks: Sequence[int], ranks_per_node: int | None) -> tuple[int, int]:
    """(bytes sent, bytes received) by group rank `rank` in `call` to and from ranks of other nodes:
    exactly what the traffic meter's cross_node_bytes_sent and cross_node_bytes_recv record.

    `ranks[i]` is group rank i's global rank; nodes are `ranks_per_node` consecutive global ranks
    (None: one node, so (0, 0)). `call.ranks_per_node` is what `hierarchical` cuts the group by
    (`CommConfig.node_size`), which may differ from the global nodes on a sub-group.
    """
    node = _node_of(call, ranks, ranks_per_node)
    sent = recv = 0
    for m in messages(call, rank):
        if node(m.src) != node(m.dst):
            if m.src == rank:
                sent += m.nbytes
            else:
                recv += m.nbytes
    return sent, recv


def link_seconds(nbytes: int, messages: int, gbps: float, latency_us: float) -> float:
    """Time of `messages` messages totalling `nbytes` sent one after another over one emulated link
    of `gbps` GB/s (1e9 bytes/s) and `latency_us` per message: messages·α + bytes·β (Hockney 1994),
    what the link emulator makes its sender wait."""
    if not gbps > 0 or latency_us < 0:
        raise ValueError(f"link_seconds needs gbps > 0 and latency_us >= 0, got {gbps} and {latency_us}")
    return messages * latency_us * 1e-6 + nbytes / (gbps * 1e9)


def emulated_seconds(call: Call, ranks: Sequence[int], ranks_per_node: int | None, gbps: float,
                     latency_us: float) -> float:
    """Predicted time the link emulator adds to `call`: Σ over steps of max over ranks of the
    rank's inter-node messages in that step, sent one after another (`link_seconds`).

    A model, stated so it can be checked: steps are taken as synchronous (a step ends when its
    slowest rank's inter-node messages have arrived), which is how the ring runs in the steady state
    of its pipeline (each step of rank r forwards what arrived in the step before), and each rank's
    messages of one step share its one link (naive's root sends its n-1 messages in turn).
    Intra-node transfers, reductions and the real transport are not in it: they come on top in a
    measurement. With every ring chunk the same size this is 2(n-1)·(pieces·α + S/n·β) for a flat
    ring all-reduce that crosses nodes, against 2(m-1)·(pieces·α + S/m·β) for hierarchical on m nodes
    and 2(m-1)·(pieces·α + S/(k·m)·β) for hierarchical_2d, whose k ranks per node cross at once.
    """
    node = _node_of(call, ranks, ranks_per_node)
    busy: dict[tuple, dict[int, list[int]]] = {}
    for r in range(call.n):
        for m in messages(call, r):
            if m.src == r and node(m.src) != node(m.dst):
                tally = busy.setdefault(m.step, {}).setdefault(r, [0, 0])
                tally[0] += m.nbytes
                tally[1] += m.pieces
    return sum(max(link_seconds(b, p, gbps, latency_us) for b, p in by_rank.values())
               for by_rank in busy.values())
