"""Hierarchical (topology-aware) all-reduce traffic (Jia et al. 2018).

Nodes are consecutive blocks of k = `call.node_size` ranks (the last may be smaller), m =
ceil(n / k) of them, each led by its first rank. For a payload of S bytes, rank r at position
i = r mod k of a node of size k_j:

- intra-node: a binomial reduce to the leader then a binomial broadcast from it over k_j ranks
  (`volumes.tree.whole`): the leader receives and reduces ceil(log2 k_j)·S and sends
  ceil(log2 k_j)·S in 2·ceil(log2 k_j) rounds;
- inter-node (leaders only): the ring all-reduce of `volumes.ring` over m ranks, chunks recut by
  `chunk_sizes(count, m)`: 2(m-1)/m·S sent and received in 2(m-1) rounds, reducing (m-1)/m·S.

The rank's volume is the sum of its parts.
"""

from __future__ import annotations

from ringzero.plan.comm.chunks import Chunks
from ringzero.plan.comm.volume import Call, Volume
from ringzero.plan.comm.volumes import ring
from ringzero.plan.comm.volumes import tree


def parts(call: Call, rank: int) -> tuple[Volume, Volume]:
    """(intra-node, inter-node) traffic of `rank`: the node's reduce + broadcast, and the leaders'
    ring (zero for non-leaders and single-node groups). The planner prices them on different links."""
    n, k, count = call.n, call.node_size, call.count
    first = rank - rank % k
    local, node_size = rank - first, min(first + k, n) - first
    intra = (tree.whole(node_size, count, call.itemsize, local, up=True)
             + tree.whole(node_size, count, call.itemsize, local, up=False))
    m = -(-n // k)
    if local or m == 1:
        return intra, Volume()
    leaders = Call(collective="all_reduce", algorithm="ring", n=m, sizes=Chunks(count, m),
                   itemsize=call.itemsize, segment_bytes=call.segment_bytes)
    return intra, ring.all_reduce(leaders, rank // k)


def all_reduce(call: Call, rank: int) -> Volume:
    intra, inter = parts(call, rank)
    return intra + inter
