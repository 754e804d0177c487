"""The `Comm` every collective algorithm in `ringzero.comm.algorithms` runs on, written down.

An algorithm never touches torch: it sees a group of ranks through a `Comm` and moves slices of
flat 1-D buffers with it. Three kinds of object play that part: `p2p.TorchComm` (torch.distributed
point-to-point, what `comm.api` runs), `symbolic.SymComm` (numpy arrays of symbols on threads, what
the explainer runs) and `subcomm.SubComm` (a subset of another Comm's ranks, so algorithms compose).
The members below are exactly those the algorithms use, and nothing else.

Two levels, because the backends differ in one way. On NCCL separately issued sends and receives
serialise on one stream, so every step's messages must go out together (`exchange`); the symbolic
Comm does the same so that its steps line up with the textbook rounds. `Comm` is that lockstep
interface. Gloo's messages are truly asynchronous, and there the pipelined ring posts each segment
on its own (Patarasuk & Yuan 2009 §3): `AsyncComm` adds those calls, and a Comm whose `async_p2p`
is true must be one.

Deadlock freedom is the algorithms' side of the contract: messages between one pair of ranks
match in posting order, so both sides post them in the same order, and a step posts all its sends
and receives before waiting on any.

Torch-free, as the symbolic Comm is: the explainer runs the algorithms on numpy alone.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


class Buffer(Protocol):
    """A flat 1-D buffer (a torch tensor, a numpy array): its length, and slices that are views,
    so that `buf[lo:hi]` handed to `exchange` is filled in place."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: slice, /) -> Buffer: ...


@runtime_checkable
class Handle(Protocol):
    """Posted messages: `wait()` returns once all of them have completed."""

    def wait(self) -> None: ...


@runtime_checkable
class Comm(Protocol):
    """One rank's view of a group during one collective call, posting messages step by step."""

    @property
    def rank(self) -> int:
        """This rank's number in the group, 0 .. size - 1: every peer below is a group rank."""

    @property
    def size(self) -> int:
        """The number of ranks in the group."""

    @property
    def itemsize(self) -> int:
        """Bytes per buffer element: the ring cuts chunks into segments of so many bytes."""

    @property
    def ranks_per_node(self) -> int | None:
        """Ranks per node, nodes being consecutive blocks of group ranks (the hierarchical
        all-reduces); None: the whole group is one node."""

    @property
    def async_p2p(self) -> bool:
        """Whether single messages may be posted on their own (gloo): then this is an `AsyncComm`.
        False: every step goes through one `exchange` (NCCL, the symbolic ranks)."""

    def empty(self, n: int) -> Buffer:
        """Scratch of `n` elements for this call (its contents undefined)."""

    def exchange(self, sends: Sequence[tuple[int, Buffer]] = (), recvs: Sequence[tuple[int, Buffer]] = (),
                 new_round: bool = True) -> Handle:
        """Post `sends` and `recvs` [(peer, buffer)] at once, waiting on none; empty buffers are
        skipped. `new_round`: this call opens a round for the traffic meter (False: it continues
        the current one)."""

    def sendrecv(self, sends: Sequence[tuple[int, Buffer]] = (), recvs: Sequence[tuple[int, Buffer]] = (),
                 new_round: bool = True) -> None:
        """`exchange(sends, recvs, new_round).wait()`: one blocking step."""

    def reduce(self, dst: Buffer, src: Buffer) -> None:
        """dst = op(dst, src), elementwise and in place (the call's reduction operator)."""

    def copy(self, dst: Buffer, src: Buffer) -> None:
        """dst = src, in place (a rank's own chunk in an all-to-all)."""


@runtime_checkable
class AsyncComm(Comm, Protocol):
    """A `Comm` that can also post single messages, which the pipelined ring does on gloo."""

    def split(self, buf: Buffer, sizes: Sequence[int]) -> Sequence[Buffer]:
        """Views of consecutive pieces of `buf`, of `sizes` elements each (one call for all)."""

    def post_send(self, peer: int, buf: Buffer, new_round: bool = False) -> Handle:
        """Post one non-empty send to `peer`; `new_round` as in `exchange`."""

    def post_recv(self, peer: int, buf: Buffer, new_round: bool = False) -> Handle:
        """Post one non-empty receive from `peer` into `buf`; `new_round` as in `exchange`."""

    def post_recv_reduce(self, peer: int, dst: Buffer, scratch: Buffer, new_round: bool = False) -> Handle:
        """Post one non-empty receive from `peer` whose message `wait()` reduces into `dst`
        (`reduce(dst, message)`); `scratch`, as long as `dst`, is where it may land first (a
        transport that can reduce straight from its own buffers leaves it untouched)."""
