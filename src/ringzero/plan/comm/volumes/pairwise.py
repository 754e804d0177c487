"""Pairwise-exchange all-to-all traffic (Thakur, Rabenseifner & Gropp 2005 §3.6).

Rank r sends M[r][j] to every j != r and receives M[i][r] from every i != r, one message each
(empty ones skipped), over n-1 steps — one round per step in which r sends or receives something.
With every chunk non-empty: n-1 rounds, n-1 messages each way, Σ_j≠r M[r][j] out and
Σ_i≠r M[i][r] in; for an even split of S that is (n-1)/n·S each way. The step at which r meets
each peer follows `ringzero.plan.comm.schedules.peers` (XOR partners for a power of two).
"""

from __future__ import annotations

from ringzero.plan.comm.volume import Call, Tally, Volume
from ringzero.plan.comm.schedules import peers


def all_to_all(call: Call, rank: int) -> Volume:
    t = Tally(call.itemsize)
    for s in range(1, call.n):
        dst, src = peers(call.n, rank, s)
        t.step([call.matrix[rank][dst]], [call.matrix[src][rank]])
    return t.volume()
