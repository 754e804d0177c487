"""Traffic meter: every byte, message and round that ringzero's collectives put on the wire.

    with ringzero.comm.TrafficMeter() as m:
        comm.all_reduce(t, algorithm="ring")
    m.summary()  # {"rank": 0, "ops": {"all_reduce/ring": {"bytes_sent": ..., ...}}}

Counts are per rank and per (collective, algorithm). A *round* is one step of the algorithm in
which this rank sends or receives at least one message: the length of this rank's chain of
dependent communication steps (pipelined segments of one step are messages of the same round).
Bytes reduced (the γ term of the cost model) are counted too, and the bytes that cross nodes
(`cross_node_bytes_*`, by the peer's global rank). A record is the planner's own type,
`ringzero.plan.comm.volume.Volume`: `plan.comm.volume.volume` and `plan.comm.links` give the
analytic twin of every figure, and the tests assert that they agree exactly. Algorithm "torch" (the backend's own collectives) is counted as calls only: its messages
never pass through ringzero, so neither its bytes nor their nodes can be seen.
"""

from __future__ import annotations

import dataclasses
import threading

import torch.distributed as dist

from ringzero.comm.timeline import current
from ringzero.plan.comm.volume import FIELDS, Volume

Traffic = Volume
"""The meter's record: the planner's `Volume`, with `calls` and the cross-node bytes counted too."""

_ACTIVE: list["TrafficMeter"] = []


LOCK = threading.Lock()
"""Guards the records: tensor parallelism's collectives (compute thread) and the data-parallel ones
(communication thread) may update the same record at once, and `+=` on a list item is not atomic."""


_INDEX = {name: i for i, name in enumerate(FIELDS)}


def active_entries(key: str) -> list[list[int]]:
    """The counters that one collective call should update (one per open meter, and the call's own
    record when this thread is inside a recorded collective: `comm.timeline.current`), created at zero:
    each a list of `Volume`'s fields in `FIELDS` order, added to in place (a `Volume` built per
    message would cost ~15 us against ~1 us; the meter's reads build them: `python -m timeit -s
    "from ringzero.plan.comm.volume import Volume; acc = Volume()" "acc += Volume(bytes_sent=1,
    bytes_recv=1, messages_sent=1, messages_recv=1, rounds=1)"` against `python -m timeit -s
    "c = [0] * 8" "c[1] += 1; c[2] += 1; c[3] += 1"`)."""
    rec = current()
    with LOCK:
        out = [m._counts.setdefault(key, [0] * len(FIELDS)) for m in _ACTIVE]
    return out if rec is None or rec.counts is None else out + [rec.counts]


def add(entries: list[list[int]], **deltas: int) -> None:
    """Add `deltas` (field -> amount) to every counter in `entries`."""
    if not entries:
        return
    with LOCK:
        for counts in entries:
            for k, v in deltas.items():
                counts[_INDEX[k]] += v


class TrafficMeter:
    """Context manager that records this rank's traffic while it is open (meters may nest)."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}

    @property
    def records(self) -> dict[str, Volume]:
        """"collective/algorithm" -> its totals so far."""
        with LOCK:
            return {k: Volume(**dict(zip(FIELDS, c))) for k, c in self._counts.items()}

    def __enter__(self) -> "TrafficMeter":
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    def reset(self) -> None:
        """Forget every record (a call still running adds to counters no longer kept)."""
        with LOCK:
            self._counts.clear()

    def get(self, collective: str, algorithm: str) -> Volume:
        """Totals for one (collective, algorithm); zeros if it never ran."""
        with LOCK:
            counts = self._counts.get(f"{collective}/{algorithm}")
        return Volume() if counts is None else Volume(**dict(zip(FIELDS, counts)))

    def total(self) -> Volume:
        return sum(self.records.values(), Volume())

    def summary(self) -> dict:
        """Plain data: this rank and its records keyed "collective/algorithm"."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        return {"rank": rank, "ops": {k: dataclasses.asdict(v) for k, v in sorted(self.records.items())}}

    def gather(self, dst: int = 0, group=None) -> list[dict] | None:
        """Every rank's summary, on rank `dst` only (others get None); a collective call."""
        mine = self.summary()
        if not dist.is_initialized():
            return [mine]
        out = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
        dist.gather_object(mine, out, dst=dst, group=group)
        return out
