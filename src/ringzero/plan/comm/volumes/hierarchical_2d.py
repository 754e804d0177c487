"""Two-dimensional hierarchical all-reduce traffic (Mikami et al. 2018).

Nodes are consecutive blocks of k = `call.node_size` ranks, m = n / k of them, all full. For
rank r = j·k + i (node j, local index i) and a buffer cut into k pieces by `Chunks(count, k)`:

- intra-node: the ring reduce-scatter and all-gather of `volumes.ring` over the k ranks of the
  node: (k-1)/k·S sent each way per phase, k-1 rounds each;
- inter-node: the ring all-reduce of `volumes.ring` of piece i over the m ranks of local index i
  (chunks recut by `Chunks(piece, m)`): 2(m-1)/m·S/k sent and received in 2(m-1) rounds.

The rank's volume is the sum of its parts.
"""

from __future__ import annotations

from ringzero.plan.comm.chunks import Chunks
from ringzero.plan.comm.volume import Call, Volume
from ringzero.plan.comm.volumes import ring


def node_count(call: Call) -> tuple[int, int]:
    """(k, m): ranks per node and nodes; raises when k does not divide the group."""
    n, k = call.n, call.node_size
    if n % k:
        raise ValueError(f"hierarchical_2d needs full nodes: a group of {n} ranks with {k} per node "
                         "leaves a partial node; use hierarchical or ring")
    return k, n // k


def parts(call: Call, rank: int) -> tuple[Volume, Volume]:
    """(intra-node, inter-node) traffic of `rank`: the node's reduce-scatter + all-gather, and the
    ring all-reduce of its piece across nodes (zero on one node). Priced on different links."""
    k, m = node_count(call)
    pieces = Chunks(call.count, k)
    node = Call(collective="reduce_scatter", algorithm="ring", n=k, sizes=pieces,
                itemsize=call.itemsize, segment_bytes=call.segment_bytes)
    local = rank % k
    intra = ring.reduce_scatter(node, local) + ring.all_gather(node, local)
    if m == 1:
        return intra, Volume()
    cross = Call(collective="all_reduce", algorithm="ring", n=m, sizes=Chunks(pieces[local], m),
                 itemsize=call.itemsize, segment_bytes=call.segment_bytes)
    return intra, ring.all_reduce(cross, rank // k)


def all_reduce(call: Call, rank: int) -> Volume:
    intra, inter = parts(call, rank)
    return intra + inter
