"""Parameter server (Li et al. 2014, OSDI): key-range partition, incast, α-β step time, staleness.

P workers train on data shards; S_v servers each own one contiguous key range of the flat parameter
vector of n elements (ps-lite's key ranges: Li et al. 2014 §3.1 (key, value) vectors, §3.2 range
push and pull, §4.3 each server owns one key range). Every step a worker pushes its gradient and
pulls the new parameters, cut by range, one message per non-empty range and direction.

    ranges      server s owns [b_s, b_{s+1}) with b = chunk_bounds(n, S_v): sizes r_s differ by at
                most one, so no server is stuck with all the small (or all the big) tensors
    imbalance   ε = max_s r_s / (n / S_v) − 1 ≤ 1 / ⌊n / S_v⌋ when n ≥ S_v
    worker      push n·B, pull n·B per step (B = bytes per element in the training precision)
    server s    in P·r_s·B (the incast: P workers into one link), out P·r_s·B; Σ_s in = P·n·B
    link time   server: 2P·α + P·r_max·B / bw;  worker: 2k·α + n·B / bw  (k non-empty ranges)
    step        compute + max(server link, worker link)        (synchronous, full-duplex links,
                pushes and pulls overlapped key by key; `comm_seconds` "staggered": pulls, then the
                last worker's push)
    waiting     BSP: worker i waits max_j c_j − c_i for the slowest (the straggler problem)

The server link is P / S_v times busier than a worker's (P·r_max vs n, r_max ≈ n / S_v), so with
more workers than servers the servers' links set the pace, and it takes S_v >= P servers (each on
its own link) to take them off the critical path.

Consistency (Li et al. 2014 §3.5 bounded delay; Ho et al. 2013 §2 stale synchronous parallel, SSP):
`sync` waits for every worker each step, `ssp` lets the fastest run at most S steps ahead of the
slowest, `async` never waits. See `max_staleness` for what that bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ringzero.plan.comm.chunks import chunk_bounds

MODES = ("sync", "async", "ssp")


def _int(name: str, value, least: int) -> None:
    if type(value) is not int or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def _nonneg(name: str, value) -> None:
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def server_ranges(numel: int, servers: int) -> list[tuple[int, int]]:
    """The [lo, hi) key range of each server: `numel` elements cut into `servers` contiguous near-equal
    pieces (the first numel % servers one element longer), server s owning piece s. Equal cuts of the
    flat vector, not whole tensors per server: a tensor may span servers, so the load does not
    depend on the model's tensor sizes (ps-lite slices every push and pull by server key range)."""
    _int("servers", servers, 1)
    _int("numel", numel, 0)
    b = chunk_bounds(numel, servers)
    return list(zip(b[:-1], b[1:]))


def imbalance(ranges: Sequence[tuple[int, int]]) -> float:
    """ε = (largest range / mean range) − 1: how much longer than a fair share the busiest server's
    range is (0.0 for an equal cut and when there is nothing to cut)."""
    if not ranges:
        raise ValueError("imbalance needs at least one range, got none")
    sizes = [hi - lo for lo, hi in ranges]
    total = sum(sizes)
    return 0.0 if total == 0 else max(sizes) * len(sizes) / total - 1.0


def server_state_bytes(numel: int, itemsize: int, servers: int) -> list[int]:
    """Bytes each server holds for its range r_s: the parameters in the training precision, Adam's
    two fp32 moments, and an fp32 master when the training precision is 16-bit (with fp32 the
    parameters are the master): r_s·(itemsize + 8 + 4·[itemsize < 4])."""
    _int("itemsize", itemsize, 1)
    per = itemsize + 8 + (4 if itemsize < 4 else 0)
    return [(hi - lo) * per for lo, hi in server_ranges(numel, servers)]


def worker_bytes(numel: int, itemsize: int) -> tuple[int, int]:
    """(push, pull) bytes per worker per step: the whole gradient out and the whole parameter vector
    back, each numel·itemsize in the training precision (Li et al. 2014 §3.3: push and pull)."""
    _int("numel", numel, 0)
    _int("itemsize", itemsize, 1)
    return numel * itemsize, numel * itemsize


def server_ingress(numel: int, itemsize: int, workers: int, servers: int) -> list[int]:
    """Bytes into each server per step: every worker pushes that server's range, workers·r_s·itemsize
    (the incast; they sum to workers·numel·itemsize)."""
    _int("workers", workers, 1)
    _int("itemsize", itemsize, 1)
    return [workers * (hi - lo) * itemsize for lo, hi in server_ranges(numel, servers)]


def server_egress(numel: int, itemsize: int, workers: int, servers: int) -> list[int]:
    """Bytes out of each server per step: every worker pulls that server's range back (the same
    workers·r_s·itemsize as the pushes in)."""
    return server_ingress(numel, itemsize, workers, servers)


def _check_link(compute_s: float, link_bw: float, link_alpha: float) -> None:
    _nonneg("compute_s", compute_s)
    if not link_bw > 0:
        raise ValueError(f"link_bw must be > 0 bytes/s, got {link_bw!r}")
    _nonneg("link_alpha", link_alpha)


def server_link_seconds(numel: int, itemsize: int, workers: int, servers: int, link_bw: float,
                        link_alpha: float = 0.0) -> float:
    """α-β time (Hockney 1994) of the busiest server's one link per step: `workers` push messages in
    and `workers` pull messages out, α each, and max(in, out) bytes at `link_bw` (full duplex)."""
    _check_link(0.0, link_bw, link_alpha)
    busiest = max(server_ingress(numel, itemsize, workers, servers))
    if busiest == 0:
        return 0.0
    out = max(server_egress(numel, itemsize, workers, servers))
    return 2 * workers * link_alpha + max(busiest, out) / link_bw


def worker_link_seconds(numel: int, itemsize: int, servers: int, link_bw: float,
                        link_alpha: float = 0.0) -> float:
    """α-β time of one worker's link per step: one push and one pull message per server with a
    non-empty range, α each, and max(push, pull) = numel·itemsize bytes at `link_bw` (full duplex)."""
    _check_link(0.0, link_bw, link_alpha)
    push, pull = worker_bytes(numel, itemsize)
    busy = sum(1 for lo, hi in server_ranges(numel, servers) if hi > lo)
    return 2 * busy * link_alpha + max(push, pull) / link_bw if busy else 0.0


SCHEDULES = ("overlapped", "staggered")


def step_seconds(numel: int, itemsize: int, workers: int, servers: int, compute_s: float, link_bw: float,
                 link_alpha: float = 0.0, schedule: str = "overlapped") -> float:
    """Seconds per synchronous step: compute_s, then the pushes and pulls (`comm_seconds`).
    Communication is not overlapped with compute (the push needs the whole backward's gradient in
    this model)."""
    _check_link(compute_s, link_bw, link_alpha)
    return compute_s + comm_seconds(numel, itemsize, workers, servers, link_bw, link_alpha, schedule)


def comm_seconds(numel: int, itemsize: int, workers: int, servers: int, link_bw: float,
                 link_alpha: float = 0.0, schedule: str = "overlapped") -> float:
    """Seconds of one step's pushes and pulls: the slower of the busiest server's link and a
    worker's link.

    The server link is the bottleneck when workers / servers > 1: it receives workers·r_max ≈
    (workers/servers)·numel elements through one link while each worker sends only numel through
    its own (incast: many senders, one receiver; more servers spread it).

    `schedule` "overlapped": both directions run at once. ps-lite's kvstores push and pull key by
    key, so one key's pull runs while later keys' pushes still arrive and the busier direction
    bounds the link.
    "staggered" (ringzero's engine, synchronous): a server answers once the step's pushes are all
    in and applied, one worker after another, so a step's pulls take one direction's time, the
    slower of the server's W·r_max bytes out and a worker's n in. The workers then start their
    next step one pull apart, and their pushes arrive as far apart: only the last worker's push,
    its n bytes through its own link, waits behind the slowest compute. Both are in the step.
    """
    _check_link(0.0, link_bw, link_alpha)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r} is not supported; allowed: {', '.join(SCHEDULES)}")
    server = server_link_seconds(numel, itemsize, workers, servers, link_bw, link_alpha)
    worker = worker_link_seconds(numel, itemsize, servers, link_bw, link_alpha)
    if schedule == "overlapped":
        return max(server, worker)
    push, _ = worker_bytes(numel, itemsize)
    busy = sum(1 for lo, hi in server_ranges(numel, servers) if hi > lo)
    server_phase = workers * link_alpha + max(server_ingress(numel, itemsize, workers, servers)) / link_bw
    worker_phase = busy * link_alpha + push / link_bw
    return max(server_phase, worker_phase) + worker_phase if busy else 0.0


def wait_seconds(compute_s: Sequence[float]) -> list[float]:
    """Seconds each worker idles per synchronous step: max(compute) − compute[i]. Under BSP every
    worker waits at the barrier for the slowest (the straggler problem SSP relaxes, Ho et al. 2013 §1)."""
    for i, c in enumerate(compute_s):
        _nonneg(f"compute_s[{i}]", c)
    slowest = max(compute_s, default=0.0)
    return [slowest - c for c in compute_s]


def check_servers(servers: int, workers: int, workers_are: str = "") -> None:
    """The rule `ringzero train --strategy ps` and `ringzero plan --servers` share: at least one
    server, and fewer servers than workers (`workers_are` says where the workers come from, for the
    error). ValueError naming both otherwise."""
    _int("servers", servers, 1)
    if servers >= workers:
        raise ValueError(f"servers={servers} must be fewer than the {workers} workers{workers_are}; a server "
                         "per worker or more leaves servers idle")


@dataclass(frozen=True)
class PSConfig:
    """A parameter-server job: `workers` computing, `servers` holding key ranges, and the consistency
    model: "sync" (BSP: the server sums a step's pushes and applies them together, every worker
    waits for the slowest), "ssp" (a worker may be at most `staleness` steps ahead of the slowest,
    Ho et al. 2013 §2) or "async" (nobody waits, Li et al. 2014 §3.5 eventual consistency)."""

    workers: int
    servers: int
    mode: str = "sync"
    staleness: int = 0
    """SSP's S (ssp only): the clock gap allowed between the fastest and the slowest worker."""

    def __post_init__(self) -> None:
        _int("workers", self.workers, 1)
        _int("servers", self.servers, 1)
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not supported; allowed: {', '.join(MODES)}")
        _int("staleness", self.staleness, 0)
        if self.staleness and self.mode != "ssp":
            raise ValueError(f"staleness={self.staleness} needs mode 'ssp', got mode {self.mode!r} "
                             "(sync is SSP with staleness 0; async has no bound)")

    def bound(self) -> int | None:
        """The clock gap the model allows between fastest and slowest worker: 0 (sync), S (ssp),
        None (async: unbounded)."""
        return {"sync": 0, "ssp": self.staleness, "async": None}[self.mode]

    def max_staleness(self) -> int | None:
        """`max_staleness(self.mode, self.staleness, self.workers)`."""
        return max_staleness(self.mode, self.staleness, self.workers)


def max_staleness(mode: str, staleness: int, workers: int) -> int | None:
    """The most steps an update's worker can be ahead of the parameters it computed on: sync 0, ssp S
    (0 with one worker), async None.

    Definitions (Ho et al. 2013 §2, in clocks). A worker's clock counts its steps whose push a server
    has applied; the server's clock is the slowest worker's. A pull carries the server's clock at the
    moment it is answered. The staleness of worker p's update of its step c is c minus the clock its
    parameters carried: how many steps p ran ahead of the slowest worker's state it saw, the gap SSP
    bounds. (An update's lag in versions, the pushes applied in between, is up to (2S + 1)(P − 1).)

    Bound. SSP's gate answers worker p's pull for its step c only once the server's clock is >= c − S,
    so the staleness is <= S, reached when p is held at the gate S steps ahead of a straggler. sync
    (and ssp with S = 0) gives 0: every pull waits for every push of the step. One worker is the
    slowest: 0. async has no gate: None (unbounded; each update records its own).
    """
    cfg = PSConfig(workers, 1, mode, staleness)
    if cfg.mode == "async":
        return None
    return 0 if cfg.mode == "sync" or cfg.workers == 1 else cfg.staleness
