"""A symbolic `Comm`: the real algorithm code run on n threads over buffers of symbols.

The explainer (`ringzero.comm.explain`) must show what an algorithm *does*, not what someone
believes it does, so it never re-implements one: it runs the very function that `TorchComm` runs,
on `SymComm`, whose buffers are numpy object arrays (slicing one gives a view, so `buf[lo:hi]` in
an algorithm works unchanged) holding the `Sym` values of `ringzero.comm.symbolic_values` instead
of numbers; `reduce` merges them, so after a ring all-reduce every rank holds `a0+b0+c0+d0` at
element 0.

Each rank's code runs in its own thread. Messages go through one mailbox per (sender, receiver)
pair and match in posting order, as on the wire; a send takes a copy when it is posted, a receive
fills its view when waited on. Every message gets a global *step* so that ranks whose rounds do not
line up (tree, naive) can be shown side by side: a rank's round is posted at step 1 + the largest
step it has seen (its own previous round, or any message it received), and a message's step is the
later of its sender's and its receiver's round (a root that receives one message per round takes
them at successive steps). For the ring this gives exactly n-1 reduce-scatter steps then n-1
all-gather steps. A rank's buffer is snapshotted after every change, stamped with its step.

A wrong algorithm cannot hang the explainer: when every unfinished rank is blocked on a receive
that nothing will satisfy, the run stops at once with a deadlock report; a rank that loops forever
hits the join timeout; messages left unreceived at the end are reported too.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

# Sym, JUNK, fmt and letter are unused here but re-exported: callers import them from this module.
from ringzero.comm.symbolic_values import JUNK, Sym, combine, fmt, letter  # noqa: F401


class SymbolicError(RuntimeError):
    """The algorithm misbehaved on the symbolic Comm (deadlock, bad peer, size mismatch, ...)."""


class _Aborted(Exception):
    """Raised in a rank's thread when another rank has already failed."""


@dataclass(frozen=True)
class Message:
    """One message: `src` sent `contents` to `dst` at global `step` (its `seq`-th to `dst`)."""

    step: int
    src: int
    dst: int
    seq: int
    round: int
    """The sender's round index (1-based), counted as the traffic meter counts rounds."""
    contents: tuple


@dataclass(frozen=True)
class Trace:
    """What a symbolic run did."""

    messages: tuple[Message, ...]
    """Sorted by (step, src, dst, seq)."""
    snapshots: tuple[tuple[tuple[int, tuple], ...], ...]
    """Per rank: (step, watched buffer) after every change, starting with (0, initial contents)."""
    rounds: tuple[int, ...]
    """Per rank: rounds as the traffic meter counts them."""


class _World:
    """Mailboxes and the bookkeeping that detects deadlock, shared by the n rank threads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.box: dict[tuple[int, int, int], tuple[int, int, np.ndarray]] = {}
        self.sent: dict[tuple[int, int], int] = defaultdict(int)
        self.posted: dict[tuple[int, int], int] = defaultdict(int)
        self.messages: list[Message] = []
        self.waiting: dict[int, tuple[int, int]] = {}  # blocked rank -> (src, seq) it waits for
        self.running = n  # ranks neither finished nor blocked
        self.failed: str | None = None
        self.error: BaseException | None = None

    def deliver(self, src: int, dst: int, step: int, rnd: int, data: np.ndarray) -> None:
        with self.cond:
            seq = self.sent[(src, dst)]
            self.sent[(src, dst)] += 1
            self.box[(src, dst, seq)] = (step, rnd, data)
            if self.waiting.get(dst) == (src, seq):
                # Unblock the receiver here, under the lock, so that it counts as running before
                # this sender can itself block and make everyone look stuck.
                del self.waiting[dst]
                self.running += 1
            self.cond.notify_all()

    def take(self, src: int, dst: int, seq: int):
        with self.cond:
            key = (src, dst, seq)
            while key not in self.box:
                if self.failed:
                    raise _Aborted
                if dst not in self.waiting:
                    self.waiting[dst] = (src, seq)
                    self.running -= 1
                    if self._deadlocked():
                        raise _Aborted
                self.cond.wait(0.5)
            return self.box.pop(key)

    def finish(self, rank: int, exc: BaseException | None) -> None:
        with self.cond:
            self.running -= 1
            if exc is not None and not isinstance(exc, _Aborted) and self.failed is None:
                self.failed, self.error = f"rank {rank} raised {type(exc).__name__}: {exc}", exc
            self.cond.notify_all()
            self._deadlocked()

    def _deadlocked(self) -> bool:
        """True (and the run marked failed) when every unfinished rank waits on a receive."""
        if self.running == 0 and self.waiting and not self.failed:
            waits = "; ".join(f"rank {r} waits for message #{seq + 1} from rank {s}"
                              for r, (s, seq) in sorted(self.waiting.items()))
            self.failed = f"deadlock: {waits}"
            self.cond.notify_all()
        return self.failed is not None


class _Pending:
    """Receives posted by one `exchange`; `wait()` fills their views in posting order."""

    def __init__(self, comm: "SymComm", recvs: list[tuple[int, int, int, np.ndarray]]) -> None:
        self._comm, self._recvs = comm, recvs

    def wait(self) -> None:
        c, recvs, self._recvs = self._comm, self._recvs, []
        for src, seq, post_step, view in recvs:
            send_step, rnd, data = c._world.take(src, c.rank, seq)
            if len(data) != len(view):
                raise SymbolicError(f"rank {c.rank} posted a receive of {len(view)} elements from rank "
                                    f"{src}, but that rank's message #{seq + 1} has {len(data)}")
            view[...] = data
            step = max(send_step, post_step)
            c._clock, c._seen = max(c._clock, step), max(c._seen, step)
            with c._world.cond:
                c._world.messages.append(Message(step, src, c.rank, seq, rnd, tuple(data)))
        c._snapshot()


class SymComm:
    """A `ringzero.comm.protocol.Comm` over numpy object arrays of `Sym` values.

    Lockstep (`async_p2p` false): every step is one `exchange`, as on NCCL, so it needs none of
    `AsyncComm`'s single-message calls."""

    def __init__(self, world: _World, rank: int, itemsize: int, ranks_per_node: int | None) -> None:
        self._world = world
        self.rank, self.size, self.itemsize = rank, world.n, itemsize
        self.ranks_per_node = ranks_per_node
        # Algorithms post each step's sends and receives together here (as on NCCL), so a
        # round is one exchange call and steps line up with the textbook walk-throughs.
        self.async_p2p = False
        self.rounds = 0
        self._clock = 0  # largest step this rank has taken part in (rounds posted or received)
        self._seen = 0  # largest step of a message this rank has received: stamps its snapshots
        self._step = 0  # step of the round in progress
        self.watch: np.ndarray | None = None
        self.snapshots: list[tuple[int, tuple]] = []

    def empty(self, n: int) -> np.ndarray:
        return np.empty(n, dtype=object)  # filled with None: never written

    def exchange(self, sends: Sequence[tuple[int, np.ndarray]] = (), recvs: Sequence[tuple[int, np.ndarray]] = (),
                 new_round: bool = True) -> _Pending:
        sends = [(self._peer(p), b) for p, b in sends if len(b)]
        recvs = [(self._peer(p), b) for p, b in recvs if len(b)]
        if not sends and not recvs:
            return _Pending(self, [])
        if new_round or self._step == 0:
            self._step = self._clock = self._clock + 1
        self.rounds += 1 if new_round else 0
        w = self._world
        for p, b in sends:
            w.deliver(self.rank, p, self._step, self.rounds, np.array(b, dtype=object, copy=True))
        posted = []
        for p, b in recvs:
            with w.cond:
                seq = w.posted[(p, self.rank)]
                w.posted[(p, self.rank)] += 1
            posted.append((p, seq, self._step, b))
        return _Pending(self, posted)

    def sendrecv(self, sends: Sequence[tuple[int, np.ndarray]] = (), recvs: Sequence[tuple[int, np.ndarray]] = (),
                 new_round: bool = True) -> None:
        self.exchange(sends, recvs, new_round).wait()

    def reduce(self, dst: np.ndarray, src: np.ndarray) -> None:
        if len(dst) != len(src):
            raise SymbolicError(f"rank {self.rank}: reduce of {len(src)} elements into {len(dst)}")
        for i in range(len(dst)):
            dst[i] = combine(dst[i], src[i])
        self._snapshot()

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        if len(dst) != len(src):
            raise SymbolicError(f"rank {self.rank}: copy of {len(src)} elements into {len(dst)}")
        if len(dst):
            dst[...] = src
            self._snapshot()

    def _peer(self, p: int) -> int:
        if not 0 <= p < self.size or p == self.rank:
            raise SymbolicError(f"rank {self.rank} addressed peer {p} in a group of {self.size}")
        return p

    def _snapshot(self) -> None:
        now = tuple(self.watch)
        if not self.snapshots or self.snapshots[-1][1] != now:
            self.snapshots.append((self._seen, now))


def _check_matched(world: _World) -> None:
    """Every send met a posted receive and every receive was waited on, or say which did not."""
    pairs = sorted(set(world.sent) | set(world.posted))
    bad = [f"rank {s} sent {world.sent[(s, d)]} message(s) to rank {d}, which posted "
           f"{world.posted[(s, d)]} receive(s)"
           for s, d in pairs if world.sent[(s, d)] != world.posted[(s, d)]]
    bad += [f"rank {d} never waited on its receive #{k + 1} from rank {s}"
            for s, d, k in sorted(world.box) if k < world.posted[(s, d)]]
    if bad:
        raise SymbolicError("unmatched messages: " + "; ".join(bad))


def run(fn: Callable, n: int, setup: Callable[[int], tuple[tuple, np.ndarray]], *, itemsize: int = 4,
        ranks_per_node: int | None = None, timeout: float = 30.0) -> Trace:
    """Run `fn(comm, *args)` on n symbolic ranks; `setup(rank)` gives (args, buffer to watch).

    Raises `SymbolicError` naming the rank and the cause when the algorithm raises, deadlocks,
    runs past `timeout` seconds or leaves messages unreceived.
    """
    world = _World(n)
    comms = []
    for r in range(n):
        c = SymComm(world, r, itemsize, ranks_per_node)
        args, c.watch = setup(r)
        c.snapshots.append((0, tuple(c.watch)))
        comms.append((c, args))

    def body(c: SymComm, args: tuple) -> None:
        exc = None
        try:
            fn(c, *args)
        except BaseException as e:  # reported by the main thread, with the rank
            exc = e
        world.finish(c.rank, exc)

    threads = [threading.Thread(target=body, args=ca, daemon=True, name=f"sym-rank-{ca[0].rank}")
               for ca in comms]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for r, t in enumerate(threads):
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            with world.cond:
                world.failed = world.failed or f"rank {r} did not finish within {timeout:g} s"
                world.cond.notify_all()
            raise SymbolicError(world.failed)
    if world.failed:
        raise SymbolicError(world.failed) from world.error
    _check_matched(world)
    return Trace(messages=tuple(sorted(world.messages, key=lambda m: (m.step, m.src, m.dst, m.seq))),
                 snapshots=tuple(tuple(c.snapshots) for c, _ in comms),
                 rounds=tuple(c.rounds for c, _ in comms))
