"""Exact traffic of every collective algorithm, per rank: the analytic twin of the traffic meter.

`volume(call, rank)` returns what rank `rank` sends, receives and reduces, in how many messages and
rounds, when the collective `call.collective` runs with `call.algorithm`. The formulas live in
`ringzero.plan.comm.volumes.<module>` next to nothing else, mirror the files in `ringzero.comm.algorithms`
(both named by `plan.comm.algorithms`), and are checked against the meter byte for byte in the tests.

Conventions (the same as `ringzero.comm`): a buffer is cut into `n` chunks whose element counts are
`call.sizes` (`chunks.chunk_sizes(count, n)` for all-reduce, reduce and broadcast; one chunk per rank
for all-gather, reduce-scatter, gather and scatter); zero-length messages are never sent; a round
is an algorithm step in which the rank sends or receives at least one message.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields
from functools import cached_property

from ringzero.plan.comm.algorithms import ALGORITHMS
from ringzero.plan.comm.chunks import SEGMENT_BYTES, Chunks, Listed, as_chunks, chunk_sizes, n_segments

MODULES: dict[tuple[str, str], str] = {(c, a): m for c, algs in ALGORITHMS.items() for a, m in algs.items()}
"""(collective, algorithm) -> module under ringzero.plan.comm.volumes (its function is named after the
collective), from the one table of `plan.comm.algorithms`."""

BACKEND_TWIN: dict[str, str] = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring"}
"""Algorithm "torch" (the backend's own collective) is priced as this algorithm's traffic. Gloo's
all-reduce and all-gather and NCCL's ring protocol run a ring on large buffers (NCCL switches to a
tree only for small all-reduces), moving the ring's 2(n-1)/n·S and (n-1)/n·S per rank (Patarasuk &
Yuan 2009). A model, not a measurement: the traffic meter cannot see inside the backend's calls."""

ROOTED = ("reduce", "broadcast", "gather", "scatter")
WHOLE_BUFFER = ("all_reduce", "reduce", "broadcast")


@dataclass(frozen=True, kw_only=True)
class Call:
    """One collective call as the planner sees it."""

    collective: str
    algorithm: str
    n: int
    """Ranks in the group."""
    sizes: tuple[int, ...] | Chunks = ()
    """Chunk element counts (length n): any tuple, or `Chunks` for the near-equal cut of `call_for`
    (O(1) per question, so that a formula never lists a million ranks). Empty for all_to_all, which
    uses `matrix`."""
    itemsize: int = 4
    """Bytes per element."""
    root: int = 0
    """Root rank of reduce, broadcast, gather and scatter."""
    ranks_per_node: int | None = None
    """Ranks per node for `hierarchical` (None: one node)."""
    matrix: tuple[tuple[int, ...], ...] = ()
    """all_to_all: matrix[i][j] = elements rank i sends to rank j."""
    segment_bytes: int = SEGMENT_BYTES
    """Pipelining segment of the ring algorithms."""

    @cached_property
    def chunks(self) -> Chunks | Listed:
        """`sizes` with the `Chunks` interface (bounds, spans, histogram)."""
        return as_chunks(self.sizes)

    @property
    def count(self) -> int:
        return self.chunks.total if self.sizes else sum(map(sum, self.matrix))

    @property
    def segment_elems(self) -> int:
        return max(1, self.segment_bytes // self.itemsize)

    @property
    def node_size(self) -> int:
        k = self.ranks_per_node or self.n
        return max(1, min(k, self.n))


def call_for(collective: str, algorithm: str, n: int, count: int, itemsize: int = 4, root: int = 0,
             ranks_per_node: int | None = None) -> Call:
    """The Call that `ringzero.comm` makes for a buffer of `count` elements.

    `count` is the whole buffer: the tensor for all-reduce/reduce/broadcast, the n-chunk output of
    all-gather/gather, the n-chunk input of reduce-scatter/scatter, and all of one rank's
    all-to-all input (split evenly, every rank sending count/n... as `chunk_sizes` cuts it).
    """
    if collective == "all_to_all":
        row = tuple(chunk_sizes(count, n))
        return Call(collective=collective, algorithm=algorithm, n=n, itemsize=itemsize,
                    matrix=tuple(row for _ in range(n)))
    if collective not in WHOLE_BUFFER and count % n:
        raise ValueError(f"{collective} on {n} ranks needs a count divisible by {n}, got {count}")
    return Call(collective=collective, algorithm=algorithm, n=n, sizes=Chunks(count, n), itemsize=itemsize,
                root=root, ranks_per_node=ranks_per_node)


def _extra(source: str):
    """A field that the formulas of `ringzero.plan.comm.volumes` leave 0; `source` gives its figure."""
    return field(default=0, metadata={"extra": source})


@dataclass(frozen=True, kw_only=True)
class Volume:
    """One rank's traffic for one (collective, algorithm), summed over `calls` calls.

    The one type of both twins: the traffic meter (`ringzero.comm.meter`) records one per
    (collective, algorithm), and `volume` gives one call's. The formulas give the figures of
    `FORMULA_FIELDS`; the others (`_extra`) the meter counts and they leave 0.
    """

    calls: int = _extra("the traffic meter; one call's formula counts none")
    """Calls summed (the meter counts them; a formula gives one call's traffic and leaves this 0)."""
    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    messages_recv: int = 0
    rounds: int = 0
    bytes_reduced: int = 0
    cross_node_bytes_sent: int = _extra("plan.comm.links.cross_node_bytes")
    """Of `bytes_sent`, the bytes whose receiver is on another node (nodes are `ranks_per_node`
    consecutive global ranks; one node when it is unset, then this is 0). The intra-node bytes are
    bytes_sent - cross_node_bytes_sent. Always 0 for algorithm "torch": the backend's own
    collectives are not seen message by message."""
    cross_node_bytes_recv: int = _extra("plan.comm.links.cross_node_bytes")
    """Of `bytes_recv`, the bytes whose sender is on another node."""

    def __add__(self, other: "Volume") -> "Volume":
        return Volume(**{k: getattr(self, k) + getattr(other, k) for k in FIELDS})

    def __mul__(self, times: int) -> "Volume":
        """`times` repeats of this traffic."""
        return Volume(**{k: getattr(self, k) * times for k in FIELDS})

    __rmul__ = __mul__

    def figures(self) -> "Volume":
        """Only the figures of `FORMULA_FIELDS` (the others 0): a meter record as `volume` gives it."""
        return Volume(**{k: getattr(self, k) for k in FORMULA_FIELDS})

    def astuple(self) -> tuple[int, ...]:
        """The figures of `FORMULA_FIELDS`, in that order."""
        return tuple(getattr(self, k) for k in FORMULA_FIELDS)


FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Volume))
FORMULA_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Volume) if "extra" not in f.metadata)
"""The fields a formula of `ringzero.plan.comm.volumes` gives: bytes and messages each way, rounds
and bytes reduced."""


@dataclass
class Tally:
    """Accumulates a rank's volume step by step, in elements (the formulas' scratch pad)."""

    itemsize: int
    sent: int = 0
    recv: int = 0
    msgs_sent: int = 0
    msgs_recv: int = 0
    rounds: int = 0
    reduced: int = 0
    _in_round: bool = field(default=False, repr=False)

    def step(self, send: list[int] = (), recv: list[int] = (), reduce: int = 0, segment: int = 0) -> None:
        """One algorithm step: messages of these element counts (empty ones are skipped).

        With `segment > 0` each message is cut into ceil(size/segment) pieces, as the ring does.
        """
        s = [x for x in send if x > 0]
        r = [x for x in recv if x > 0]
        if not s and not r:
            return
        self.rounds += 1
        self.sent += sum(s)
        self.recv += sum(r)
        self.msgs_sent += sum(n_segments(x, segment) for x in s) if segment else len(s)
        self.msgs_recv += sum(n_segments(x, segment) for x in r) if segment else len(r)
        self.reduced += reduce

    def volume(self) -> Volume:
        k = self.itemsize
        return Volume(bytes_sent=self.sent * k, bytes_recv=self.recv * k, messages_sent=self.msgs_sent,
                      messages_recv=self.msgs_recv, rounds=self.rounds, bytes_reduced=self.reduced * k)


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw: the fraction of the buffer each rank must move at the least.

    all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all, gather, scatter (n-1)/n;
    broadcast and reduce 1 (nccl-tests doc/PERFORMANCE.md). It makes busbw comparable with the link
    speed whatever the collective and world size.
    """
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


def formula(collective: str, algorithm: str) -> str:
    """The algorithm whose traffic formula prices `algorithm`: itself, or `BACKEND_TWIN`'s for "torch"."""
    if algorithm != "torch":
        return algorithm
    if collective not in BACKEND_TWIN:
        raise ValueError(f"no traffic model for the backend's own {collective} (algorithm 'torch'); "
                         f"modelled: {', '.join(BACKEND_TWIN)}")
    return BACKEND_TWIN[collective]


def volume(call: Call, rank: int) -> Volume:
    """Rank `rank`'s traffic for `call` (exact, in bytes)."""
    key = (call.collective, call.algorithm)
    if key not in MODULES:
        raise ValueError(f"no volume formula for {call.collective} with algorithm {call.algorithm!r}")
    if not 0 <= rank < call.n:
        raise ValueError(f"rank {rank} is not in a group of {call.n}")
    if call.n == 1 or call.count == 0:
        return Volume()
    module = importlib.import_module(f"ringzero.plan.comm.volumes.{MODULES[key]}")
    return getattr(module, call.collective)(call, rank)


def busiest(call: Call) -> int:
    """The rank whose traffic bounds the call: the root of a rooted collective, else rank 0 (naive's
    parameter server, the tree's root, hierarchical's first leader; on a ring every rank moves the
    same up to one element per chunk), except under MPICH's fold (butterfly, recursive doubling and
    halving, Rabenseifner on n not a power of two: Thakur, Rabenseifner & Gropp 2005 §4.1), where
    rank 0 only hands its buffer to rank 1, which does its own work and rank 0's."""
    folds = MODULES.get((call.collective, call.algorithm)) in ("butterfly", "rabenseifner")
    if folds and call.n & (call.n - 1):
        return 1
    return call.root if call.collective in ROOTED else 0


def volumes(call: Call) -> list[Volume]:
    """Every rank's traffic for `call`."""
    return [volume(call, r) for r in range(call.n)]



PIPELINED: dict[tuple[str, str], int] = {("all_reduce", "ring"): 2, ("reduce_scatter", "ring"): 1,
                                         ("all_gather", "ring"): 1}
"""(collective, algorithm) that pipeline their steps in segments -> phases of n - 1 steps
(`ringzero.comm.algorithms.ring`: all-reduce is a reduce-scatter, drained, then an all-gather)."""


def overlapped_bytes(call: Call, v: Volume) -> int:
    """Bytes of a rank's busier direction (`v`: its volume for `call`) that travel while an earlier
    segment is still being moved or reduced: off the critical path of the pipeline.

    The ring (Patarasuk & Yuan 2009) cuts each step's chunk into m = ceil(chunk / segment) segments
    and a segment's send waits only for the segment it forwards, so a phase of n - 1 steps is a
    pipeline of (n - 1)·m segment transfers in which each stage takes max(α + β·s, γ·s), and its
    critical path is n - 1 + m - 1 segments, not (n - 1)·m (the pipelined-chain time). With one
    segment per chunk (chunk <= segment: small buffers) nothing overlaps and this is 0; 0 for every
    algorithm that does not pipeline.
    """
    phases = PIPELINED.get((call.collective, call.algorithm))
    if phases is None or call.n == 1:
        return 0
    largest = max(call.chunks.histogram(), default=0)
    m = n_segments(largest, call.segment_elems)
    if m <= 1:
        return 0
    critical = phases * (call.n - 2 + m) * min(largest, call.segment_elems) * call.itemsize
    return max(0, max(v.bytes_sent, v.bytes_recv) - critical)
