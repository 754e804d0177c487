"""α-β-γ cost of one collective call, from the exact traffic of every rank.

Hockney's model (1994) prices one message of S bytes at T = α + βS (α is the startup latency paid
per message/round, β the time per byte, the inverse of bandwidth). Thakur,
Rabenseifner & Gropp ("Optimization of collective communication operations in MPICH", 2005) add
γ, the time per byte reduced, and cost every MPICH algorithm as rounds·α + bytes·β + reduced·γ;
Patarasuk & Yuan (2009) use the same model to show that the ring is bandwidth-optimal.

Rather than re-derive each algorithm's closed form here, `predict` reads the algorithm's exact
per-rank traffic from `plan.comm.volume.volume` (the formulas the traffic meter is checked against).
A call takes as long as its slowest rank r, priced with the textbook terms

    T_r = per_call + α·rounds_r + per_message·messages_r + β·bytes_r + γ·reduced_r

(bytes_r = max(sent, received): a full-duplex link carries both directions at once; messages_r
likewise), plus a host term for ranks that share one machine's cores, as `--nproc` local ranks do:

    T = max_r T_r + host_message·Σ_r messages_r + host_beta·Σ_r bytes_r + host_gamma·Σ_r reduced_r

On a cluster every rank owns its link and CPU and the host coefficients are ~0 (the textbook
model). On one machine with fewer cores than ranks every message costs a wake-up and a system call
and every byte a copy on the same few cores, so the work of all ranks adds up. On 4 ranks a ring
all-reduce sends 24 messages in 6 rounds and a binomial tree 6 messages in 4 rounds: the
slowest-rank terms see 6 against 4, the host term 24 against 6, and on the 2-core development
machine the ring is 2-3x slower at 1 KiB (`ringzero bench comm --nproc 4 --collective all_reduce
--algorithm ring,tree --sizes 1KiB`). There, fitted on one run and tested on the next, the
host term cut the median prediction error from ~19 % to ~14 % and raised the share of
(size, world) cells where the cheapest predicted all-reduce is within 10 % of the fastest
measured one from ~65 % to ~90 % (`python benchmarks/bench_comm.py`: a calibration, then a fresh
evaluation run; the figures without the host term are those of the fit before it had one).

Pure Python: no torch, no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.comm.volume import Call, Volume, volume

RANK_FEATURES = ("per_call", "alpha", "per_message", "beta", "gamma")
HOST_FEATURES = ("host_message", "host_beta", "host_gamma")
FEATURES = RANK_FEATURES + HOST_FEATURES
"""Coefficient names, in the order of `features(...)`."""


@dataclass(frozen=True, kw_only=True)
class AlphaBetaGamma:
    """The coefficients of the model (all >= 0, seconds per unit).

    The defaults are the shared model fitted (`ringzero.comm.cost.fit`, weighted least squares)
    to 1,921 measurements of every all-reduce algorithm on 2, 3 and 4 ranks, 1 KiB-16 MiB, taken
    by `ringzero bench comm --nproc 4 --collective all_reduce --worlds 2,3,4 --sizes
    1KiB,2KiB,4KiB,8KiB,16KiB,32KiB,64KiB,128KiB,256KiB,512KiB,1MiB,2MiB,4MiB,8MiB,16MiB
    --calibrate` on the development machine: 2 vCPUs (a nested VM), gloo over
    loopback, torch 2.13, rounded to two digits. On five later benchmark runs they picked an
    all-reduce within 10 % of the fastest in 79-92 % of cells (`python benchmarks/bench_comm.py`,
    with no calibration file). They are what `algorithm="auto"`
    uses when no calibration file exists; another machine should calibrate its own (`--calibrate`).
    """

    alpha: float = 80e-6
    """Seconds per round (a dependent communication step) of the slowest rank."""
    beta: float = 0.55e-9
    """Seconds per byte on the busier direction of the slowest rank's link (1/bandwidth)."""
    gamma: float = 0.025e-9
    """Seconds per byte the slowest rank reduces."""
    per_message: float = 0.0
    """Seconds per message of the slowest rank (pipelined segments add messages, not rounds)."""
    per_call: float = 140e-6
    """Fixed seconds per call (argument checks, buffers, the first wake-up)."""
    host_message: float = 260e-6
    """Seconds per message sent by any rank, for ranks sharing one host's cores."""
    host_beta: float = 0.16e-9
    """Seconds per byte sent by any rank, for ranks sharing one host's cores and memory."""
    host_gamma: float = 0.15e-9
    """Seconds per byte reduced by any rank, for ranks sharing one host's cores."""

    def __post_init__(self) -> None:
        bad = [f"{k}={v!r}" for k, v in zip(FEATURES, self.coefficients()) if not v >= 0.0]
        if bad:
            raise ValueError(f"AlphaBetaGamma coefficients must be >= 0: {', '.join(bad)}")

    def coefficients(self) -> tuple[float, ...]:
        """The coefficients in `FEATURES` order."""
        return tuple(getattr(self, k) for k in FEATURES)

    @classmethod
    def from_coefficients(cls, coefs) -> "AlphaBetaGamma":
        return cls(**{k: float(v) for k, v in zip(FEATURES, coefs)})

    def as_dict(self) -> dict[str, float]:
        return dict(zip(FEATURES, self.coefficients()))


DEFAULT = AlphaBetaGamma()
SHM_DEFAULT = AlphaBetaGamma(alpha=36e-6, beta=0.05e-9, gamma=0.074e-9, per_message=14e-6, per_call=110e-6,
                             host_message=11e-6, host_beta=0.074e-9, host_gamma=0.052e-9)
"""The defaults for ranks on one host talking through shared memory (`comm.transport`): a hand-off
costs microseconds, not gloo's hundreds. The shared model of `ringzero bench comm --nproc 4
--ranks-per-node 2 --calibrate --transport shm` (every collective and algorithm, 2-4 ranks, 1 KiB-16 MiB,
552 rows) on the development machine (2 vCPUs), 2026-12-07, with every algorithm reducing straight
from the peer's slots, rounded to two digits; see `DEFAULTS`. Scored against a separate measurement
(`benchmarks/bench_comm.py`, 144 cells) these picks have a mean regret of 5.3 %, the previous
defaults' (fitted before the butterfly, Rabenseifner and the tree reduced from the slots) 6.6 %."""
DEFAULTS = {"gloo": DEFAULT, "shm": SHM_DEFAULT}
"""What `algorithm="auto"` prices with when there is no calibration, by the transport the call's
messages take (`comm.transport`), and what a calibration is pulled toward (`comm.cost.PRIOR`)."""
TEXTBOOK = AlphaBetaGamma(alpha=50e-6, beta=1e-9, gamma=0.25e-9, per_call=0.0, host_message=0.0,
                          host_beta=0.0, host_gamma=0.0)
"""A plain α-β-γ network (no host sharing) for examples and tests: 50 µs, 1 GB/s, 4 GB/s."""


def rank_features(v: Volume) -> tuple[float, ...]:
    """One rank's regressors, in `RANK_FEATURES` order: (1, rounds, messages, bytes, reduced)."""
    return (1.0, float(v.rounds), float(max(v.messages_sent, v.messages_recv)),
            float(max(v.bytes_sent, v.bytes_recv)), float(v.bytes_reduced))


def host_features(vols: list[Volume]) -> tuple[float, ...]:
    """The host regressors, in `HOST_FEATURES` order: messages, bytes and reduced, over all ranks."""
    return (float(sum(v.messages_sent for v in vols)), float(sum(v.bytes_sent for v in vols)),
            float(sum(v.bytes_reduced for v in vols)))


def rank_cost(v: Volume, model: AlphaBetaGamma) -> float:
    """Seconds one rank spends on `v` under the slowest-rank terms of `model`."""
    return sum(c * f for c, f in zip(model.coefficients(), rank_features(v)))


def slowest_rank(vols: list[Volume], model: AlphaBetaGamma) -> int:
    """The rank `model` prices highest (the lowest such rank on ties)."""
    costs = [rank_cost(v, model) for v in vols]
    return costs.index(max(costs))


def features(vols: list[Volume], rank: int) -> tuple[float, ...]:
    """All regressors of a call, in `FEATURES` order, taking `rank` as the slowest."""
    return rank_features(vols[rank]) + host_features(vols)


def predict(call: Call, model: AlphaBetaGamma = DEFAULT) -> float:
    """Predicted seconds of `call` under `model` (0 when nothing moves)."""
    vols = [volume(call, r) for r in range(call.n)]
    if not any(any(v.astuple()) for v in vols):
        return 0.0
    x = features(vols, slowest_rank(vols, model))
    return sum(c * f for c, f in zip(model.coefficients(), x))
