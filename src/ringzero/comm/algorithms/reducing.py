"""One step that receives a peer's message and reduces it into place, on any `Comm`.

Over shared memory the reduction reads the message straight from the peer's slots
(`AsyncComm.post_recv_reduce`) instead of landing it in scratch and reading it back: one pass over
the bytes fewer for every algorithm that reduces what it receives (the butterfly's fold,
Rabenseifner's recursive halving, the binomial tree's reduce), as the pipelined ring does. A
backend that posts a step as one batch (NCCL, the symbolic ranks) receives into `scratch` and
reduces after the step, as before. Either way `dst = op(dst, message)`: the same arithmetic in the
same order, so results do not depend on the transport.
"""

from __future__ import annotations

from typing import Callable, Sequence, cast

from ringzero.comm.protocol import AsyncComm, Buffer, Comm, Handle


class _Step:
    """Posted messages, the receive first (`comm.p2p.Pending`), then `after` once they are done."""

    __slots__ = ("works", "after")

    def __init__(self, works: Sequence[Handle], after: Callable[[], None] | None = None) -> None:
        self.works, self.after = works, after

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        self.works = ()
        if self.after is not None:
            after, self.after = self.after, None
            after()


def exchange_reduce(c: Comm, peer: int, dst: Buffer, scratch: Buffer,
                    sends: Sequence[tuple[int, Buffer]] = (), new_round: bool = True) -> Handle:
    """Post `sends` and a receive from `peer` that `wait()` reduces into `dst` (`scratch`, as long
    as `dst`, is where it may land first); one round of the traffic meter, as `exchange`.

    `dst` must not overlap a buffer of `sends`: over shared memory the reduction runs when the
    receive is waited for, which may be before a long send has been read out of its buffer.
    """
    if not c.async_p2p or not len(dst):
        step = c.exchange(sends, [(peer, scratch)], new_round)
        return _Step((step,), lambda: c.reduce(dst, scratch))
    a = cast(AsyncComm, c)
    works = [a.post_recv_reduce(peer, dst, scratch, new_round=new_round)]
    works += [a.post_send(p, b) for p, b in sends if len(b)]
    return _Step(works)
