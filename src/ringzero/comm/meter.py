"""Traffic meter: every byte, message and round that ringzero's collectives put on the wire.

    with ringzero.comm.TrafficMeter() as m:
        comm.all_reduce(t, algorithm="ring")
    m.summary()  # {"rank": 0, "ops": {"all_reduce/ring": {"bytes_sent": ..., ...}}}

Counts are per rank and per (collective, algorithm). A *round* is one step of the algorithm in
which this rank sends or receives at least one message: the length of this rank's chain of
dependent communication steps (pipelined segments of one step are messages of the same round).
Bytes reduced (the γ term of the cost model) are counted too, and the bytes that cross nodes
(`cross_node_bytes_*`, by the peer's global rank). `ringzero.plan.comm.volume` and
`ringzero.plan.comm.links` hold the analytic twin of every figure; the tests assert that they agree
exactly. Algorithm "torch" (the backend's own collectives) is counted as calls only: its messages
never pass through ringzero, so neither its bytes nor their nodes can be seen.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import torch.distributed as dist


@dataclass
class Traffic:
    """What one rank did for one (collective, algorithm) pair, summed over calls."""

    calls: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    messages_recv: int = 0
    rounds: int = 0
    bytes_reduced: int = 0
    cross_node_bytes_sent: int = 0
    """Of `bytes_sent`, the bytes whose receiver is on another node (nodes are
    `CommConfig.ranks_per_node` consecutive global ranks; one node when it is unset, then this is
    0). The intra-node bytes are bytes_sent - cross_node_bytes_sent. Always 0 for algorithm
    "torch": the backend's own collectives are not seen message by message."""
    cross_node_bytes_recv: int = 0
    """Of `bytes_recv`, the bytes whose sender is on another node."""

    def add(self, other: "Traffic") -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


_ACTIVE: list["TrafficMeter"] = []


LOCK = threading.Lock()
"""Guards the records: tensor parallelism's collectives (compute thread) and the data-parallel ones
(communication thread) may update the same record at once, and `+=` on an attribute is not atomic."""


def active_entries(key: str) -> list[Traffic]:
    """The Traffic records that one collective call should update (one per open meter)."""
    with LOCK:
        return [m._entry(key) for m in _ACTIVE]


def add(records: list[Traffic], **deltas: int) -> None:
    """Add `deltas` (field -> amount) to every record in `records`."""
    if not records:
        return
    with LOCK:
        for rec in records:
            for k, v in deltas.items():
                setattr(rec, k, getattr(rec, k) + v)


class TrafficMeter:
    """Context manager that records this rank's traffic while it is open (meters may nest)."""

    def __init__(self) -> None:
        self.records: dict[str, Traffic] = {}

    def _entry(self, key: str) -> Traffic:
        rec = self.records.get(key)
        if rec is None:
            rec = self.records[key] = Traffic()
        return rec

    def __enter__(self) -> "TrafficMeter":
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    def reset(self) -> None:
        self.records.clear()

    def get(self, collective: str, algorithm: str) -> Traffic:
        """Totals for one (collective, algorithm); zeros if it never ran."""
        return self.records.get(f"{collective}/{algorithm}", Traffic())

    def total(self) -> Traffic:
        out = Traffic()
        for rec in self.records.values():
            out.add(rec)
        return out

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
