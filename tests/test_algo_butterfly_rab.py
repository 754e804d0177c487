"""Butterfly / recursive doubling and Rabenseifner / recursive halving, through the public API.

Every case runs on live gloo ranks (the session pool) for world sizes 1..8, compares bit for bit
with torch.distributed's own collective on the same group (small-integer inputs, so every sum is
exact even in bfloat16), and checks the traffic meter against the planner on every rank. World
sizes 9..16 are covered by a threaded in-process Comm that runs the same algorithm code.
"""

import queue
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm.algorithms import butterfly, rabenseifner
from ringzero.plan.comm.chunks import bounds_from_sizes, chunk_bounds, chunk_sizes
from ringzero.plan.comm.volume import Call, call_for, volume
from fake_comm import PostByExchange

WORLDS = (1, 2, 3, 4, 5, 6, 7, 8)
DTYPES = (torch.float32, torch.bfloat16, torch.int64)
OPS = ("sum", "max", "min")
TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
BIG = 10007


def _counts(n):
    return sorted({0, 1, n - 1, BIG})


def _latin(cases):
    """(case, dtype, op) triples: each case with every dtype, and each dtype with every op across
    consecutive cases (a Latin square: a third of the full product, every pair still covered)."""
    return [(case, dtype, OPS[(i + j) % len(OPS)])
            for j, case in enumerate(cases) for i, dtype in enumerate(DTYPES)]


def _data(count, rank, dtype, salt=0):
    # Values in -2..2 that differ by rank and position: sums over <= 8 ranks are exact everywhere.
    x = (torch.arange(count) * (rank + 3 + salt) + 7 * rank + salt) % 5 - 2
    return x.to(dtype)


def _metered(collective, algorithm, fn):
    with comm.TrafficMeter() as m:
        fn()
    t = m.get(collective, algorithm)
    return (t.bytes_sent, t.bytes_recv, t.messages_sent, t.messages_recv, t.rounds, t.bytes_reduced)


def _check(bad, what, got, ref, traffic, call, rank):
    if not torch.equal(got, ref):
        bad.append(f"{what}: wrong result on rank {rank}")
    plan = volume(call, rank).astuple()
    if traffic != plan:
        bad.append(f"{what}: rank {rank} meter {traffic} != plan {plan}")


def _all_reduce_cases(group, algorithm):
    r, n, bad = dist.get_rank(group), dist.get_world_size(group), []
    for count, dtype, op in _latin(_counts(n) + [n + 2]):
        t = _data(count, r, dtype)
        ref = t.clone()
        dist.all_reduce(ref, op=TORCH_OPS[op], group=group)
        traffic = _metered("all_reduce", algorithm,
                           lambda: comm.all_reduce(t, op=op, group=group, algorithm=algorithm))
        call = call_for("all_reduce", algorithm, n, count, t.element_size())
        _check(bad, f"all_reduce/{algorithm} n={n} count={count} {dtype} {op}", t, ref, traffic, call, r)
    return bad


def _all_gather_cases(group):
    r, n, bad = dist.get_rank(group), dist.get_world_size(group), []
    algo = "recursive_doubling"
    for dtype in DTYPES:
        for count in _counts(n):
            inp = _data(count, r, dtype)
            out, parts = torch.empty(n * count, dtype=dtype), [torch.empty_like(inp) for _ in range(n)]
            dist.all_gather(parts, inp, group=group)
            ref = torch.cat(parts)
            traffic = _metered("all_gather", algo,
                               lambda: comm.all_gather_into_tensor(out, inp, group=group, algorithm=algo))
            call = call_for("all_gather", algo, n, n * count, inp.element_size())
            _check(bad, f"all_gather_into_tensor n={n} count={count} {dtype}", out, ref, traffic, call, r)
        for sizes in _uneven(n):
            inp = _data(sizes[r], r, dtype, salt=1)
            outs = [torch.empty(s, dtype=dtype) for s in sizes]
            traffic = _metered("all_gather", algo,
                               lambda: comm.all_gather(outs, inp, group=group, algorithm=algo))
            # gloo's all_gather needs equal sizes: gather padded copies, then trim.
            pad = max(sizes)
            padded = [torch.empty(pad, dtype=dtype) for _ in range(n)]
            dist.all_gather(padded, torch.cat([inp, torch.zeros(pad - sizes[r], dtype=dtype)]), group=group)
            ref = torch.cat([p[:s] for p, s in zip(padded, sizes)])
            call = Call(collective="all_gather", algorithm=algo, n=n, sizes=tuple(sizes),
                        itemsize=inp.element_size())
            _check(bad, f"all_gather sizes={sizes} {dtype}", torch.cat(outs), ref, traffic, call, r)
    return bad


def _uneven(n):
    """Chunk size lists with empty, tiny and odd chunks in varying places."""
    return [[(3 * i + 1) % 5 for i in range(n)], [BIG if i == n // 2 else i % 2 for i in range(n)]]


def _reduce_scatter_cases(group):
    r, n, bad = dist.get_rank(group), dist.get_world_size(group), []
    algo = "recursive_halving"
    cases = [("tensor", [count] * n) for count in _counts(n)] + [("list", s) for s in _uneven(n)]
    for (api, sizes), dtype, op in _latin(cases):
        full = _data(sum(sizes), r, dtype, salt=op == "max")
        b = bounds_from_sizes(sizes)
        # Reference: the backend's all-reduce of the whole input, then this rank's slice
        # (gloo's reduce_scatter does not take uneven lists).
        ref_full = full.clone()
        dist.all_reduce(ref_full, op=TORCH_OPS[op], group=group)
        ref = ref_full[b[r]:b[r + 1]]
        out = torch.empty(sizes[r], dtype=dtype)
        if api == "tensor":
            run = lambda: comm.reduce_scatter_tensor(out, full, op=op, group=group, algorithm=algo)
        else:
            parts = [full[b[i]:b[i + 1]].clone() for i in range(n)]
            run = lambda: comm.reduce_scatter(out, parts, op=op, group=group, algorithm=algo)
        traffic = _metered("reduce_scatter", algo, run)
        call = Call(collective="reduce_scatter", algorithm=algo, n=n, sizes=tuple(sizes),
                    itemsize=full.element_size())
        _check(bad, f"reduce_scatter sizes={sizes[:8]} {dtype} {op}", out, ref, traffic, call, r)
    return bad


@pytest.mark.parametrize("algorithm", ["butterfly", "rabenseifner"])
def test_all_reduce_matches_torch_and_plan(pool, algorithm):
    for world in WORLDS:
        bad = [f for fails in pool.run(_all_reduce_cases, algorithm, world=world) for f in fails]
        assert not bad, bad[:5]


def test_all_gather_recursive_doubling(pool):
    for world in WORLDS:
        bad = [f for fails in pool.run(_all_gather_cases, world=world) for f in fails]
        assert not bad, bad[:5]


def test_reduce_scatter_recursive_halving(pool):
    for world in WORLDS:
        bad = [f for fails in pool.run(_reduce_scatter_cases, world=world) for f in fails]
        assert not bad, bad[:5]


def _log_rounds(group, count):
    t = torch.ones(count)
    return [_metered("all_reduce", algo, lambda: comm.all_reduce(t, group=group, algorithm=algo))
            for algo in ("rabenseifner", "butterfly")]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_power_of_two_closed_forms_on_the_wire(pool, n):
    """Thakur et al. 2005 §4.1: Rabenseifner 2·log2 n rounds and 2(n-1)/n·S; butterfly log2 n and S·log2 n."""
    count = 1024
    S, k = count * 4, n.bit_length() - 1
    for rab, bfly in pool.run(_log_rounds, count, world=n):
        assert rab[4] == 2 * k and rab[0] == rab[1] == 2 * (n - 1) * S // n
        assert rab[5] == (n - 1) * S // n
        assert bfly[4] == k and bfly[0] == bfly[1] == bfly[5] == S * k


# --- Planner-only checks, and world sizes beyond the pool on a threaded in-process Comm. ---


@pytest.mark.parametrize("n", range(1, 17))
def test_plan_conserves_bytes_and_gathers_what_is_missing(n):
    for count in (1, n - 1, 3 * n + 1, 1000):
        for coll, algo in [("all_reduce", "butterfly"), ("all_reduce", "rabenseifner"),
                           ("all_gather", "recursive_doubling"), ("reduce_scatter", "recursive_halving")]:
            sizes = tuple(chunk_sizes(count, n))
            vols = [volume(Call(collective=coll, algorithm=algo, n=n, sizes=sizes), r) for r in range(n)]
            assert sum(v.bytes_sent for v in vols) == sum(v.bytes_recv for v in vols)
            assert sum(v.messages_sent for v in vols) == sum(v.messages_recv for v in vols)
            if coll == "all_gather" and count:
                assert all(v.bytes_recv == 4 * (count - s) for v, s in zip(vols, sizes))


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_plan_closed_forms_power_of_two(n):
    count, k = 48 * n, n.bit_length() - 1
    S = 4 * count
    for r in range(n):
        rab = volume(call_for("all_reduce", "rabenseifner", n, count), r)
        assert (rab.rounds, rab.bytes_sent, rab.bytes_recv) == (2 * k, 2 * (n - 1) * S // n, 2 * (n - 1) * S // n)
        bfly = volume(call_for("all_reduce", "butterfly", n, count), r)
        assert (bfly.rounds, bfly.bytes_sent, bfly.bytes_reduced) == (k, S * k, S * k)
        rs = volume(call_for("reduce_scatter", "recursive_halving", n, count), r)
        ag = volume(call_for("all_gather", "recursive_doubling", n, count), r)
        assert rs.rounds == ag.rounds == k and rs.bytes_sent == ag.bytes_recv == (n - 1) * S // n


class _SimComm(PostByExchange):
    """A Comm over threads: sends are copied into per-pair FIFO queues at post time."""

    async_p2p = True  # receives may be posted ahead of sends, as on gloo

    def __init__(self, rank, size, queues):
        self.rank, self.size, self.itemsize, self.ranks_per_node = rank, size, 8, None
        self.q, self.t = queues, [0, 0, 0, 0, 0, 0]

    def empty(self, k):
        return np.full(k, np.nan)

    def exchange(self, sends=(), recvs=(), new_round=True):
        sends = [(p, b) for p, b in sends if b.size]
        recvs = [(p, b) for p, b in recvs if b.size]
        assert all(p != self.rank and 0 <= p < self.size for p, _ in sends + recvs)
        if sends or recvs:
            self.t[0] += 8 * sum(b.size for _, b in sends)
            self.t[1] += 8 * sum(b.size for _, b in recvs)
            self.t[2] += len(sends)
            self.t[3] += len(recvs)
            self.t[4] += 1 if new_round else 0
        for p, b in sends:
            self.q[self.rank, p].put(b.copy())
        return _SimPending([(self.q[p, self.rank], b) for p, b in recvs])

    def sendrecv(self, sends=(), recvs=(), new_round=True):
        self.exchange(sends, recvs, new_round).wait()

    @staticmethod
    def split(buf, sizes):
        return np.split(buf, np.cumsum(sizes)[:-1]) if len(sizes) else []

    def reduce(self, dst, src):
        dst += src
        self.t[5] += 8 * dst.size

    @staticmethod
    def copy(dst, src):
        dst[:] = src


class _SimPending:
    def __init__(self, recvs):
        self.recvs = recvs

    def wait(self):
        for q, b in self.recvs:
            msg = q.get(timeout=10)
            assert msg.size == b.size, (msg.size, b.size)
            b[:] = msg


def _simulate(fn, n, bufs, bounds):
    queues = {(a, b): queue.Queue() for a in range(n) for b in range(n)}
    comms = [_SimComm(r, n, queues) for r in range(n)]
    errors = []

    def body(r):
        try:
            fn(comms[r], bufs[r], bounds)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors, errors[0]
    return [tuple(c.t) for c in comms]


def _plan(collective, algorithm, n, sizes):
    call = Call(collective=collective, algorithm=algorithm, n=n, sizes=tuple(sizes), itemsize=8)
    return [volume(call, r).astuple() for r in range(n)]


@pytest.mark.parametrize("n", range(9, 17))
@pytest.mark.parametrize("algorithm", ["butterfly", "rabenseifner"])
def test_all_reduce_large_worlds_on_threads(n, algorithm):
    fn = {"butterfly": butterfly.all_reduce, "rabenseifner": rabenseifner.all_reduce}[algorithm]
    for count in (1, n - 1, 2 * n + 3, 257):
        bufs = [np.arange(count, dtype=float) + r for r in range(n)]
        traffic = _simulate(fn, n, bufs, chunk_bounds(count, n))
        want = n * np.arange(count, dtype=float) + n * (n - 1) // 2
        assert all(np.array_equal(b, want) for b in bufs)
        assert traffic == _plan("all_reduce", algorithm, n, chunk_sizes(count, n))


@pytest.mark.parametrize("n", range(9, 17))
def test_uneven_scatter_gather_large_worlds_on_threads(n):
    for salt in range(4):
        sizes = [(3 * i + salt) % 4 for i in range(n)]  # empty and odd chunks in varying places
        b = bounds_from_sizes(sizes)
        full = [np.arange(b[-1], dtype=float) * (r + 1) for r in range(n)]
        want = sum(full)
        bufs = [f.copy() for f in full]
        traffic = _simulate(rabenseifner.reduce_scatter, n, bufs, b)
        assert all(np.array_equal(bufs[r][b[r]:b[r + 1]], want[b[r]:b[r + 1]]) for r in range(n))
        assert traffic == _plan("reduce_scatter", "recursive_halving", n, sizes)
        mine = [(np.arange(b[-1]) >= b[r]) & (np.arange(b[-1]) < b[r + 1]) for r in range(n)]
        bufs = [np.where(m, want, np.nan) for m in mine]
        traffic = _simulate(butterfly.all_gather, n, bufs, b)
        assert all(np.array_equal(x, want) for x in bufs)
        assert traffic == _plan("all_gather", "recursive_doubling", n, sizes)
