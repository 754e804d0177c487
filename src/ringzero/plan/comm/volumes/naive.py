"""Naive traffic: rooted collectives sent directly, the all-* ones via a parameter server (Li et al. 2014).

Closed forms, per rank, mirroring `ringzero.comm.algorithms.naive`. S = the buffer's elements
(`call.count`), s_r = chunk r, R = the root (rank 0 for the all-* collectives). Messages are one
per non-empty chunk; a round is counted only if the rank moves a non-empty message in it.

| collective     | root R                                    | any other rank r          | rounds |
|----------------|-------------------------------------------|---------------------------|--------|
| all_reduce     | in (n-1)·S, out (n-1)·S, reduce (n-1)·S   | out S, in S               | 2      |
| reduce         | in (n-1)·S, reduce (n-1)·S                | out S                     | 1      |
| broadcast      | out (n-1)·S                               | in S                      | 1      |
| gather         | in S - s_R                                | out s_r                   | 1      |
| scatter        | out S - s_R                               | in s_r                    | 1      |
| all_gather     | in S - s_0, out (n-1)·S                   | out s_r, in S             | 2      |
| reduce_scatter | in (n-1)·S, reduce (n-1)·S, out S - s_0   | out S, in s_r             | 2      |
| all_to_all     | (no root) out Σ_j≠r M[r][j], in Σ_i≠r M[i][r]                         | 1      |

The all-reduce row is the parameter server's: the collecting GPU carries (N-1)·Φ each way, every
computing GPU Φ, 2·(N-1)·Φ (about 2·N·Φ) for the whole system.
"""

from __future__ import annotations

from dataclasses import replace

from ringzero.plan.comm.volume import Call, Volume

ROOT = 0
"""Rank 0 plays the parameter server in all-reduce, all-gather and reduce-scatter."""


def _volume(call: Call, sent: int, recv: int, msgs_sent: int, msgs_recv: int, rounds: int,
            reduced: int = 0) -> Volume:
    k = call.itemsize
    return Volume(bytes_sent=sent * k, bytes_recv=recv * k, messages_sent=msgs_sent, messages_recv=msgs_recv,
                  rounds=rounds, bytes_reduced=reduced * k)


def _nonempty(sizes) -> int:
    return sum(1 for x in sizes if x > 0)


def reduce(call: Call, rank: int) -> Volume:
    S, m = call.count, call.n - 1
    if rank == call.root:
        return _volume(call, 0, m * S, 0, m, 1, m * S)
    return _volume(call, S, 0, 1, 0, 1)


def broadcast(call: Call, rank: int) -> Volume:
    S, m = call.count, call.n - 1
    if rank == call.root:
        return _volume(call, m * S, 0, m, 0, 1)
    return _volume(call, 0, S, 0, 1, 1)


def gather(call: Call, rank: int) -> Volume:
    if rank == call.root:      # every chunk but the root's own, one message per non-empty chunk
        sizes, own = call.chunks, call.sizes[rank]
        rest = sizes.total - own
        return _volume(call, 0, rest, 0, sizes.nonempty() - (own > 0), int(rest > 0))
    own = call.sizes[rank]
    return _volume(call, own, 0, int(own > 0), 0, int(own > 0))


def scatter(call: Call, rank: int) -> Volume:
    v = gather(call, rank)  # the same messages, the other way round
    return Volume(bytes_sent=v.bytes_recv, bytes_recv=v.bytes_sent, messages_sent=v.messages_recv,
                  messages_recv=v.messages_sent, rounds=v.rounds)


def all_reduce(call: Call, rank: int) -> Volume:
    rooted = replace(call, root=ROOT)
    return reduce(rooted, rank) + broadcast(rooted, rank)


def all_gather(call: Call, rank: int) -> Volume:
    rooted = replace(call, root=ROOT)
    return gather(rooted, rank) + broadcast(rooted, rank)


def reduce_scatter(call: Call, rank: int) -> Volume:
    rooted = replace(call, root=ROOT)
    return reduce(rooted, rank) + scatter(rooted, rank)


def all_to_all(call: Call, rank: int) -> Volume:
    out = [x for j, x in enumerate(call.matrix[rank]) if j != rank]
    inc = [row[rank] for i, row in enumerate(call.matrix) if i != rank]
    busy = int(sum(out) + sum(inc) > 0)
    return _volume(call, sum(out), sum(inc), _nonempty(out), _nonempty(inc), busy)
