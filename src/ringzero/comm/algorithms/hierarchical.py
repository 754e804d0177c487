"""Hierarchical (topology-aware) all-reduce: reduce in the node, all-reduce among leaders, broadcast.

Jia et al. 2018 (hierarchical all-reduce among group masters); the two-level scheme of NCCL's
trees and Horovod's `HOROVOD_HIERARCHICAL_ALLREDUCE`; Thakur, Rabenseifner & Gropp 2005 for the
binomial pieces and Patarasuk & Yuan 2009 for the ring.

Nodes are consecutive blocks of k = `c.ranks_per_node` ranks: node j holds ranks
[j·k, min((j+1)·k, n)), so the last node may be smaller, and its first rank is the node's leader.
ranks_per_node None or >= n makes the whole group one node (the algorithm is then a tree
all-reduce); k = 1 makes every rank a leader (a plain ring). With m = ceil(n / k) nodes:

1. binomial reduce inside each node to its leader (`tree.reduce` over a `SubComm` of the node):
   ceil(log2 k) rounds, the leader receiving and reducing up to ceil(log2 k)·S over the fast links;
2. ring all-reduce among the m leaders (`ring.all_reduce` over a `SubComm` of the leaders, chunks
   recut for m ranks by `plan.comm.chunks.chunk_bounds`): 2(m-1) rounds, each leader sending
   2(m-1)/m·S over the slow network — only leaders cross it, once per node;
3. binomial broadcast inside each node from its leader: ceil(log2 k) rounds.

So a leader spends 2·ceil(log2 k) intra-node rounds and 2(m-1) inter-node rounds, against 2(n-1)
rounds of a flat ring whose every step is paced by the slowest (inter-node) link. No ranks are
folded: the binomial trees and the ring both work for any size, uneven last node included.
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm
from ringzero.plan.comm.chunks import chunk_bounds
from ringzero.comm.subcomm import SubComm
from ringzero.comm.algorithms import ring, tree


def _node(rank: int, n: int, k: int) -> list[int]:
    """The ranks of `rank`'s node: the consecutive block of k that contains it (clipped at n)."""
    first = rank - rank % k
    return list(range(first, min(first + k, n)))


def all_reduce(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """In-place all-reduce of `buf` in three phases: node reduce, leader ring, node broadcast."""
    n = c.size
    if n == 1:
        return
    k = c.ranks_per_node if c.ranks_per_node and c.ranks_per_node < n else n
    lo, count = bounds[0], bounds[-1] - bounds[0]
    node = SubComm(c, _node(c.rank, n, k))
    node_bounds = [lo + b for b in chunk_bounds(count, node.size)]
    tree.reduce(node, buf, node_bounds, 0)
    if node.rank == 0:
        leaders = SubComm(c, range(0, n, k))
        ring.all_reduce(leaders, buf, [lo + b for b in chunk_bounds(count, leaders.size)])
    tree.broadcast(node, buf, node_bounds, 0)
