"""A `Comm` restricted to a subset of another Comm's ranks, so algorithms can be composed.

The hierarchical all-reduce runs a binomial reduce inside each node, a ring among the node
leaders and a binomial broadcast inside each node again; each of those is an ordinary algorithm
from `ringzero.comm.algorithms`, run over a `SubComm` whose local rank i is the parent's rank
`members[i]`. Everything is delegated to the parent through the `Comm` interface only
(`ringzero.comm.protocol`), so a SubComm works over `TorchComm` and over the explainer's symbolic
Comm alike, and every byte it moves is metered under the parent's call. It is an `AsyncComm` when
its parent is one (its `async_p2p` is the parent's).
"""

from __future__ import annotations

from typing import Sequence

from ringzero.comm.protocol import Buffer, Comm, Handle


class SubComm:
    """The ranks `members` (parent ranks, in local-rank order) of Comm `c`, seen as ranks 0..len-1.

    Must be built only on a rank that is one of `members`. `ranks_per_node` is None: the subset is
    treated as one node (the algorithms run inside it do not split it further).
    """

    def __init__(self, c: Comm, members: Sequence[int]) -> None:
        members = list(members)
        if len(set(members)) != len(members) or any(not 0 <= m < c.size for m in members):
            raise ValueError(f"SubComm: members {members} must be distinct ranks of a group of {c.size}")
        if c.rank not in members:
            raise ValueError(f"SubComm: rank {c.rank} is not one of the members {members}")
        self.parent = c
        self.members = members
        self.rank = members.index(c.rank)
        self.size = len(members)
        self.ranks_per_node = None
        self.async_p2p = c.async_p2p  # NCCL's lockstep rule holds inside a node too

    @property
    def itemsize(self) -> int:
        return self.parent.itemsize

    def _map(self, pairs: Sequence[tuple[int, Buffer]]) -> list[tuple[int, Buffer]]:
        return [(self.members[p], b) for p, b in pairs]

    def empty(self, n: int) -> Buffer:
        return self.parent.empty(n)

    def exchange(self, sends: Sequence[tuple[int, Buffer]] = (), recvs: Sequence[tuple[int, Buffer]] = (),
                 new_round: bool = True) -> Handle:
        """The parent's `exchange` with local peer ranks translated to parent ranks."""
        return self.parent.exchange(self._map(sends), self._map(recvs), new_round=new_round)

    def sendrecv(self, sends: Sequence[tuple[int, Buffer]] = (), recvs: Sequence[tuple[int, Buffer]] = (),
                 new_round: bool = True) -> None:
        self.exchange(sends, recvs, new_round).wait()

    # post_send, post_recv(_reduce) and split are called only when async_p2p, i.e. on an AsyncComm parent.
    def post_send(self, peer: int, buf: Buffer, new_round: bool = False) -> Handle:
        return self.parent.post_send(self.members[peer], buf, new_round=new_round)

    def post_recv(self, peer: int, buf: Buffer, new_round: bool = False) -> Handle:
        return self.parent.post_recv(self.members[peer], buf, new_round=new_round)

    def post_recv_reduce(self, peer: int, dst: Buffer, scratch: Buffer, new_round: bool = False) -> Handle:
        return self.parent.post_recv_reduce(self.members[peer], dst, scratch, new_round=new_round)

    def split(self, buf: Buffer, sizes: Sequence[int]) -> Sequence[Buffer]:
        return self.parent.split(buf, sizes)

    def reduce(self, dst: Buffer, src: Buffer) -> None:
        self.parent.reduce(dst, src)

    def copy(self, dst: Buffer, src: Buffer) -> None:
        self.parent.copy(dst, src)
