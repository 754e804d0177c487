"""Binomial-tree reduce/broadcast/all-reduce/gather/scatter and the hierarchical all-reduce.

On the live pool (worlds 1-8) every result is compared bit for bit with torch.distributed's own
collective on the same group, and the traffic meter with the planner's formula on every rank. An
in-process threaded Comm runs the same algorithm code for worlds up to 16 (beyond the pool).
"""

import queue
import threading

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import config
from ringzero.comm.algorithms import hierarchical, ring, tree
from ringzero.comm.subcomm import SubComm
from ringzero.plan.comm.chunks import bounds_from_sizes, chunk_bounds, chunk_sizes
from ringzero.plan.comm.volume import Call, call_for, volume
from fake_comm import PostByExchange

DTYPES = (torch.float32, torch.bfloat16, torch.int64)
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
BIG = 10007


def _data(count, dtype, op, rank, salt=0):
    """Small integers, so every reduction is exact in every dtype and order (products are of 1s and 2s)."""
    i = torch.arange(count)
    if op == "product":
        return (1 + ((i + rank + salt) % 3 == 0).long()).to(dtype)
    return ((i * 7 + rank * 3 + salt) % 11 - 5).to(dtype)


def _traffic(m, coll, alg):
    t = m.get(coll, alg)
    return (t.bytes_sent, t.bytes_recv, t.messages_sent, t.messages_recv, t.rounds, t.bytes_reduced)


def _check(bad, label, got, ref, m, coll, alg, call, rank):
    if not torch.equal(got, ref):
        bad.append(f"{label}: wrong result on rank {rank}")
    want = volume(call, rank).astuple()
    if _traffic(m, coll, alg) != want:
        bad.append(f"{label}: rank {rank} meter {_traffic(m, coll, alg)} != plan {want}")


def _reducing(group, bad, n, r, count, dtype, op, root, rpn=None):
    """all_reduce (tree, or hierarchical with rpn ranks per node) or, with a root, reduce (tree)."""
    x = _data(count, dtype, op, r, salt=root)
    ref, t = x.clone(), x.clone()
    with comm.TrafficMeter() as m:
        if root < 0 and rpn is None:
            dist.all_reduce(ref, op=OPS[op], group=group)
            comm.all_reduce(t, op=op, group=group, algorithm="tree")
        elif root < 0:
            dist.all_reduce(ref, op=OPS[op], group=group)
            with comm.configure(ranks_per_node=rpn):
                comm.all_reduce(t, op=op, group=group, algorithm="hierarchical")
        else:
            dist.reduce(ref, dist.get_global_rank(group, root), op=OPS[op], group=group)
            comm.reduce(t, root, op=op, group=group, algorithm="tree")
            if r != root:
                ref = x  # a non-root's input is left as it was
    coll, alg = ("reduce", "tree") if root >= 0 else ("all_reduce", "hierarchical" if rpn else "tree")
    call = call_for(coll, alg, n, count, t.element_size(), max(root, 0), ranks_per_node=rpn)
    _check(bad, f"{alg} {coll} n={n} count={count} {dtype} {op} root={root} rpn={rpn}",
           t, ref, m, coll, alg, call, r)


def _moving(group, bad, n, r, coll, count, dtype, root):
    """broadcast / gather / scatter (tree) of `count` elements per rank from or to `root`."""
    groot = dist.get_global_rank(group, root)
    mine = _data(count, dtype, "sum", r, salt=root)
    with comm.TrafficMeter() as m:
        if coll == "broadcast":
            ref, got = mine.clone(), mine.clone()
            dist.broadcast(ref, groot, group=group)
            comm.broadcast(got, root, group=group, algorithm="tree")
        elif coll == "gather":
            refs = [torch.empty_like(mine) for _ in range(n)] if r == root else None
            outs = [torch.full_like(mine, -9) for _ in range(n)] if r == root else None
            dist.gather(mine, refs, dst=groot, group=group)
            comm.gather(mine, outs, dst=root, group=group, algorithm="tree")
            ref, got = (torch.cat(refs), torch.cat(outs)) if r == root else (mine, mine)
        else:
            pieces = [_data(count, dtype, "sum", j, salt=root + 1) for j in range(n)] if r == root else None
            ref, got = torch.empty_like(mine), torch.full_like(mine, -9)
            dist.scatter(ref, pieces, src=groot, group=group)
            comm.scatter(got, pieces, src=root, group=group, algorithm="tree")
    total = count if coll == "broadcast" else count * n
    call = call_for(coll, "tree", n, total, mine.element_size(), root)
    _check(bad, f"tree {coll} n={n} count={count} {dtype} root={root}", got, ref, m, coll, "tree", call, r)


def _roots(n):
    """Every root on small worlds; on larger ones the roots whose subtrees wrap differently."""
    return range(n) if n <= 5 else sorted({0, 1, n // 2, n - 1})


def _world(group):
    """Every case for one world size; returns this rank's failures."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    bad, ops = [], list(OPS)
    odd_root = 1 % n  # a root whose gather/scatter subtrees wrap past rank n-1 (from n = 4)
    for count in (0, 1, max(n - 1, 2), BIG):
        for root in _roots(n):  # float32 sum from every root
            _reducing(group, bad, n, r, count, torch.float32, "sum", root)
            for coll in ("broadcast", "gather", "scatter"):
                _moving(group, bad, n, r, coll, count, torch.float32, root)
        for i, dtype in enumerate(DTYPES):
            for coll in ("broadcast", "gather", "scatter"):
                _moving(group, bad, n, r, coll, count, dtype, odd_root)
            for op in ops:
                _reducing(group, bad, n, r, count, dtype, op, odd_root)
                _reducing(group, bad, n, r, count, dtype, op, -1)
            # hierarchical: each ranks-per-node with each dtype, the op rotating so all pairs occur
            for j, rpn in enumerate(sorted({1, 2, 3, n})):
                _reducing(group, bad, n, r, count, dtype, ops[(i + j) % 3], -1, rpn)
    return bad


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7, 8])
def test_tree_and_hierarchical_match_torch_and_plan(pool, world):
    failures = [f for rank_bad in pool.run(_world, world=world) for f in rank_bad]
    assert not failures, "\n".join(failures[:20])


# ---- worlds beyond the pool: the same algorithm code on an in-process threaded Comm ----

class _Net:
    """Mailboxes per (src, dst): sends are copied when posted, receives matched in posting order."""

    def __init__(self, n):
        self.boxes = {(s, d): queue.Queue() for s in range(n) for d in range(n)}


class _ThreadComm(PostByExchange):
    async_p2p = True  # receives may be posted ahead of sends, as on gloo
    def __init__(self, net, rank, n, rpn=None):
        self.net, self.rank, self.size, self.itemsize, self.ranks_per_node = net, rank, n, 8, rpn
        self.posted = {p: [] for p in range(n)}  # src -> receives not yet filled, in posting order
        self.traffic = [0] * 6

    def empty(self, k):
        return torch.empty(k, dtype=torch.float64)

    def exchange(self, sends=(), recvs=(), new_round=True):
        sends = [(p, b) for p, b in sends if len(b)]
        recvs = [(p, b) for p, b in recvs if len(b)]
        assert all(p != self.rank for p, _ in sends + recvs)
        if sends or recvs:
            t = self.traffic
            t[0] += 8 * sum(len(b) for _, b in sends)
            t[1] += 8 * sum(len(b) for _, b in recvs)
            t[2], t[3], t[4] = t[2] + len(sends), t[3] + len(recvs), t[4] + bool(new_round)
        for p, b in sends:
            self.net.boxes[(self.rank, p)].put(b.clone())
        for p, b in recvs:
            self.posted[p].append(b)
        return _Handle(self, recvs)

    def sendrecv(self, sends=(), recvs=(), new_round=True):
        self.exchange(sends, recvs, new_round).wait()

    @staticmethod
    def split(buf, sizes):
        return buf.split(sizes)

    def reduce(self, dst, src):
        dst.add_(src)
        self.traffic[5] += 8 * len(dst)

    def copy(self, dst, src):
        dst.copy_(src)


class _Handle:
    def __init__(self, c, recvs):
        self.c, self.recvs = c, recvs

    def wait(self):
        for p, buf in self.recvs:
            while any(b is buf for b in self.c.posted[p]):
                target = self.c.posted[p].pop(0)
                msg = self.c.net.boxes[(p, self.c.rank)].get(timeout=10)
                assert len(msg) == len(target), "message size mismatch"
                target.copy_(msg)


def _simulate(n, fn, rpn=None):
    """Run fn(comm, rank) on n threads; returns the per-rank (result, traffic tuple)."""
    net, out, errors = _Net(n), [None] * n, []

    def body(r):
        try:
            c = _ThreadComm(net, r, n, rpn)
            out[r] = (fn(c, r), tuple(c.traffic))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out


@pytest.mark.parametrize("n", [6, 9, 13, 16])
def test_worlds_beyond_the_pool(n):
    count, sizes = 2 * n + 3, [(j * 5) % 4 for j in range(n)]  # uneven, some empty chunks
    want_sum = n * (n + 1) / 2
    for root in range(n) if n < 10 else (0, 1, 3, n // 2, n - 1):
        for name in ("reduce", "broadcast", "gather", "scatter"):
            rooted = _Rooted(name, n, root, count, sizes)
            res = _simulate(n, rooted.run)
            for r, (buf, traffic) in enumerate(res):
                plan = volume(Call(collective=name, algorithm="tree", n=n, sizes=rooted.sizes, itemsize=8,
                                   root=root), r)
                assert traffic == plan.astuple(), (name, n, root, r, traffic, plan)
                rooted.check(r, buf)
    for rpn in (None, 1, 2, 3, 4, 5, n - 1):
        res = _simulate(n, lambda c, r: _hier(c, r, count, n), rpn)
        for r, (buf, traffic) in enumerate(res):
            assert torch.all(buf == want_sum), (rpn, r, buf)
            plan = volume(call_for("all_reduce", "hierarchical", n, count, 8, ranks_per_node=rpn), r)
            assert traffic == plan.astuple(), (rpn, r, traffic, plan)


class _Rooted:
    """One rooted tree collective on the threaded Comm: inputs, and what each rank must end with."""

    def __init__(self, name, n, root, count, sizes):
        self.name, self.n, self.root = name, n, root
        self.moves = name in ("gather", "scatter")
        self.sizes = tuple(sizes) if self.moves else tuple(chunk_sizes(count, n))
        self.bounds = bounds_from_sizes(list(self.sizes))
        # gather/scatter: chunk j holds 100 + j; reduce: rank r contributes r + 1
        self.chunks = torch.repeat_interleave(torch.arange(n) + 100.0, torch.tensor(self.sizes)).double()

    def run(self, c, r):
        b = self.bounds
        buf = torch.full((b[-1],), float(r + 1), dtype=torch.float64)
        if self.name == "gather":
            buf[b[r]:b[r + 1]] = 100.0 + r
        if self.name == "scatter" and r == self.root:
            buf.copy_(self.chunks)
        getattr(tree, self.name)(c, buf, b, self.root)
        return buf

    def check(self, r, buf):
        b, n, root = self.bounds, self.n, self.root
        if self.name == "scatter":
            assert torch.all(buf[b[r]:b[r + 1]] == 100.0 + r), (self.name, n, root, r, buf)
        elif self.name == "broadcast":
            assert torch.all(buf == root + 1), (self.name, n, root, r, buf)
        elif r == root:
            want = self.chunks if self.name == "gather" else torch.full_like(buf, n * (n + 1) / 2)
            assert torch.equal(buf, want), (self.name, n, root, r, buf)


def _hier(c, r, count, n):
    buf = torch.full((count,), float(r + 1), dtype=torch.float64)
    hierarchical.all_reduce(c, buf, chunk_bounds(count, n))
    return buf


def test_subcomm_maps_ranks_and_rejects_outsiders():
    net = _Net(4)
    parent = _ThreadComm(net, 2, 4)
    sub = SubComm(parent, [3, 2, 0])
    assert (sub.rank, sub.size, sub.itemsize, sub.ranks_per_node) == (1, 3, 8, None)
    sub.exchange(sends=[(0, torch.ones(2))]).wait()
    assert net.boxes[(2, 3)].qsize() == 1 and parent.traffic[0] == 16
    with pytest.raises(ValueError, match="not one of the members"):
        SubComm(parent, [0, 1])
    with pytest.raises(ValueError, match="distinct ranks"):
        SubComm(parent, [2, 2])


def test_plan_formulas_match_the_closed_forms():
    """Root totals of Thakur et al. 2005 §3, and conservation of bytes, for n <= 16."""
    for n in range(2, 17):
        lg = (n - 1).bit_length()  # ceil(log2 n)
        ar = volume(call_for("all_reduce", "tree", n, 1000), 0)
        assert (ar.bytes_sent, ar.bytes_recv, ar.rounds) == (lg * 4000, lg * 4000, 2 * lg)
        for root in range(n):
            for coll in ("reduce", "broadcast", "gather", "scatter"):
                vols = [volume(call_for(coll, "tree", n, 40 * n, 4, root), r) for r in range(n)]
                assert sum(v.bytes_sent for v in vols) == sum(v.bytes_recv for v in vols)
                assert sum(v.messages_sent for v in vols) == sum(v.messages_recv for v in vols)
                assert vols[root].rounds == lg
            g = volume(call_for("gather", "tree", n, 40 * n, 4, root), root)
            assert g.bytes_recv == 4 * 40 * (n - 1)
        for k in range(1, n + 1):
            m = -(-n // k)
            lead = volume(call_for("all_reduce", "hierarchical", n, 1000, 4, ranks_per_node=k), 0)
            assert lead.rounds == 2 * (k - 1).bit_length() + 2 * (m - 1)


@pytest.mark.parametrize("lookahead,beside", [(1, False), (2, False), (5, False), (1, True)])
@pytest.mark.parametrize("n", [3, 6])
def test_ring_pipelining_any_lookahead(monkeypatch, n, lookahead, beside):
    """Many segments per chunk (3 elements each), uneven and empty chunks, receives posted ahead:
    `lookahead` when the ring runs alone, DEPTH (and every all-gather receive) beside compute."""
    monkeypatch.setattr(ring, "SEGMENT_BYTES", 24)
    monkeypatch.setattr(ring, "LOOKAHEAD", lookahead)
    monkeypatch.setattr(ring, "DEPTH", 3)
    sizes = [(7 * j) % 11 for j in range(n)]  # 0, 7, 3, 10, ... elements: 0 to 4 segments
    bounds, count = bounds_from_sizes(sizes), sum(sizes)

    def run(c, r):
        if beside:
            config.mark_beside_compute()  # this simulated rank's thread only
        buf = torch.arange(count, dtype=torch.float64) * (r + 1)
        ring.all_reduce(c, buf, bounds)
        return buf

    for r, (buf, traffic) in enumerate(_simulate(n, run)):
        assert torch.equal(buf, torch.arange(count, dtype=torch.float64) * (n * (n + 1) / 2)), (r, buf)
        plan = volume(Call(collective="all_reduce", algorithm="ring", n=n, sizes=tuple(sizes), itemsize=8,
                           segment_bytes=24), r)
        assert traffic == plan.astuple(), (r, traffic, plan)
    assert not config.beside_compute()  # the mark stayed on the simulated ranks' threads
