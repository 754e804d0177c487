"""Two-dimensional hierarchical all-reduce: reduce-scatter in the node, all-reduce across nodes by
local index, all-gather in the node.

Mikami et al. 2018 ("2D-Torus all-reduce": reduce-scatter horizontally, all-reduce vertically,
all-gather horizontally); Horovod's hierarchical all-reduce (a reduce-scatter inside the node, an
all-reduce across nodes, an all-gather inside the node) has the same shape. Each phase is
`algorithms.ring` over a `SubComm`.

Nodes are consecutive blocks of k = `c.ranks_per_node` ranks and must all be full (k divides n):
the cross-node phase pairs rank i of every node with rank i of every other. With m = n / k nodes
and a buffer of S bytes cut into k pieces:

1. ring reduce-scatter inside the node: local rank i ends with piece i summed over its node,
   (k-1)/k·S sent over the fast links in k-1 rounds;
2. ring all-reduce of piece i among the m ranks of local index i, one per node: 2(m-1)/m·S/k sent
   over the network in 2(m-1) rounds — by every rank at once, each over its own NIC;
3. ring all-gather inside the node: (k-1)/k·S over the fast links in k-1 rounds.

Against `hierarchical` (node leaders only cross, each sending 2(m-1)/m·S), every rank's NIC carries
1/k of the leader's bytes, so the network phase is k times shorter when NICs are per rank (as on
GPU clusters with one NIC per GPU, and in `comm.link_emulator`). k = 1 is the flat ring; k = n is
a ring reduce-scatter then all-gather inside one node.
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm
from ringzero.plan.comm.chunks import chunk_bounds
from ringzero.comm.subcomm import SubComm
from ringzero.comm.algorithms import ring


def node_size(c: Comm) -> int:
    """Ranks per node in `c`, checked to cut the group into full nodes."""
    n = c.size
    k = c.ranks_per_node if c.ranks_per_node and c.ranks_per_node < n else n
    if n % k:
        raise ValueError(f"hierarchical_2d needs full nodes: a group of {n} ranks with {k} per node "
                         "leaves a partial node; use hierarchical or ring")
    return k


def all_reduce(c: Comm, buf: Buffer, bounds: Sequence[int]) -> None:
    """In-place all-reduce of `buf`: node reduce-scatter, cross-node all-reduce, node all-gather."""
    n = c.size
    if n == 1:
        return
    k = node_size(c)
    lo, count = bounds[0], bounds[-1] - bounds[0]
    first, local = c.rank - c.rank % k, c.rank % k
    node = SubComm(c, range(first, first + k))
    pieces = [lo + b for b in chunk_bounds(count, k)]
    ring.reduce_scatter(node, buf, pieces)  # local rank i holds piece i, summed over its node
    if k < n:
        a, b = pieces[local], pieces[local + 1]
        peers = SubComm(c, range(local, n, k))
        ring.all_reduce(peers, buf[a:b], chunk_bounds(b - a, n // k))  # the ring splits what it gets
    ring.all_gather(node, buf, pieces)
