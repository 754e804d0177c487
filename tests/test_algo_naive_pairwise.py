"""naive (all eight collectives), pairwise (all-to-all) and scatter_allgather (broadcast).

Every case runs through the public API, is compared bit for bit with torch.distributed's own
collective on the same group (small-integer inputs, so sums are exact even in bfloat16), and the
traffic meter of every rank must equal `ringzero.plan.comm.volume.volume` exactly. All cases of one
world size run in a single `pool.run`; each rank returns its list of failures.
"""

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import backend
from ringzero.plan.comm.schedules import scatter_schedule
from ringzero.plan.comm.chunks import SEGMENT_BYTES
from ringzero.plan.comm.volume import Call, call_for, volume

WORLDS = (1, 2, 3, 4, 5, 7, 8)
DTYPES = (torch.float32, torch.bfloat16, torch.int64)
OPS = ("sum", "max")
LARGE = 10007
TORCH_OP = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _data(count, rank, dtype=torch.float32, salt=0):
    """Small integers (< 11), different on every rank: exact sums for up to 8 ranks in bfloat16."""
    return ((torch.arange(count) * 7 + rank * 3 + salt) % 11).to(dtype)


def _equal(got, want):
    return all(map(torch.equal, got, want)) if isinstance(got, list) else torch.equal(got, want)


class _Cases:
    """One rank's failures: wrong data and meter/plan mismatches, each with its description."""

    def __init__(self, group):
        self.group, self.n, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.failures = []

    def run(self, label, call, action, got=None, want=None):
        """Run `action()` under a meter; then `got` must equal `want` (unless `want` is None)."""
        with comm.TrafficMeter() as m:
            action()
        if want is not None and not _equal(got, want):
            self.failures.append(f"rank {self.rank}: wrong data: {label}")
        t = m.get(call.collective, call.algorithm)
        metered = (t.bytes_sent, t.bytes_recv, t.messages_sent, t.messages_recv, t.rounds, t.bytes_reduced)
        planned = volume(call, self.rank).astuple()
        if metered != planned:
            self.failures.append(f"rank {self.rank}: meter {metered} != plan {planned}: {label}")


def _whole_buffer(k, count, dtype):
    """all_reduce, reduce, broadcast of a `count`-element tensor."""
    g, n, r = k.group, k.n, k.rank
    size = torch.empty((), dtype=dtype).element_size()
    for op in OPS:
        t, ref = _data(count, r, dtype), _data(count, r, dtype)
        dist.all_reduce(ref, op=TORCH_OP[op], group=g)
        k.run(f"all_reduce naive {op} {dtype} {count}", call_for("all_reduce", "naive", n, count, size),
              lambda: comm.all_reduce(t, op=op, group=g, algorithm="naive"), t, ref)
        for root in sorted({0, n - 1}):
            t, ref = _data(count, r, dtype), _data(count, r, dtype)
            dist.reduce(ref, root, op=TORCH_OP[op], group=g)
            k.run(f"reduce naive {op} {dtype} {count} root {root}",
                  call_for("reduce", "naive", n, count, size, root),
                  lambda: comm.reduce(t, root, op=op, group=g, algorithm="naive"),
                  t, ref if r == root else None)
    for algo in ("naive", "scatter_allgather"):
        for root in sorted({0, n - 1}):
            t, ref = _data(count, r, dtype, salt=5), _data(count, r, dtype, salt=5)
            dist.broadcast(ref, root, group=g)
            k.run(f"broadcast {algo} {dtype} {count} root {root}",
                  call_for("broadcast", algo, n, count, size, root),
                  lambda: comm.broadcast(t, root, group=g, algorithm=algo), t, ref)


def _sharded(k, count, dtype):
    """all_gather, reduce_scatter, gather, scatter with `count` elements per rank."""
    g, n, r = k.group, k.n, k.rank
    size = torch.empty((), dtype=dtype).element_size()
    inp = _data(count, r, dtype)
    out, ref = torch.empty(count * n, dtype=dtype), torch.empty(count * n, dtype=dtype)
    backend.all_gather_single(ref, inp, group=g)
    k.run(f"all_gather naive {dtype} {count}", call_for("all_gather", "naive", n, count * n, size),
          lambda: comm.all_gather_into_tensor(out, inp, group=g, algorithm="naive"), out, ref)
    for op in OPS:
        big = _data(count * n, r, dtype)
        out, ref = torch.empty(count, dtype=dtype), torch.empty(count, dtype=dtype)
        backend.reduce_scatter_single(ref, big.clone(), op=TORCH_OP[op], group=g)
        k.run(f"reduce_scatter naive {op} {dtype} {count}",
              call_for("reduce_scatter", "naive", n, count * n, size),
              lambda: comm.reduce_scatter_tensor(out, big, op=op, group=g, algorithm="naive"), out, ref)
    for root in sorted({0, n - 1}):
        mine, is_root = _data(count, r, dtype), r == root
        got = [torch.empty(count, dtype=dtype) for _ in range(n)] if is_root else None
        ref = [torch.empty(count, dtype=dtype) for _ in range(n)] if is_root else None
        dist.gather(mine, ref, dst=root, group=g)
        k.run(f"gather naive {dtype} {count} root {root}", call_for("gather", "naive", n, count * n, size, root),
              lambda: comm.gather(mine, got, dst=root, group=g, algorithm="naive"), got, ref)
        pieces = [_data(count, r, dtype, salt=i) for i in range(n)] if is_root else None
        out, ref = torch.empty(count, dtype=dtype), torch.empty(count, dtype=dtype)
        dist.scatter(ref, pieces, src=root, group=g)
        k.run(f"scatter naive {dtype} {count} root {root}", call_for("scatter", "naive", n, count * n, size, root),
              lambda: comm.scatter(out, pieces, src=root, group=g, algorithm="naive"), out, ref)


def _all_to_all(k, matrix, dtype, tag):
    """naive and pairwise all_to_all where rank i sends matrix[i][j] elements to rank j."""
    g, n, r = k.group, k.n, k.rank
    size = torch.empty((), dtype=dtype).element_size()
    inp = [_data(matrix[r][j], r, dtype, salt=j) for j in range(n)]
    recv_sizes = [matrix[i][r] for i in range(n)]
    flat = torch.empty(sum(recv_sizes), dtype=dtype)  # gloo's list all_to_all wants equal sizes
    dist.all_to_all_single(flat, torch.cat(inp), recv_sizes, list(matrix[r]), group=g)
    ref = list(flat.split(recv_sizes))
    for algo in ("naive", "pairwise"):
        out = [torch.empty(s, dtype=dtype) for s in recv_sizes]
        call = Call(collective="all_to_all", algorithm=algo, n=n, itemsize=size,
                    matrix=tuple(map(tuple, matrix)))
        k.run(f"all_to_all {algo} {dtype} {tag}", call,
              lambda: comm.all_to_all(out, inp, group=g, algorithm=algo), out, ref)


def _uneven(k):
    """Uneven chunks (some empty): all_gather / reduce_scatter lists, all_to_all matrices.

    gloo has no uneven all_gather or reduce_scatter, so their references come from the inputs,
    which every rank can compute.
    """
    g, n, r = k.group, k.n, k.rank
    sizes = [(3 * i + 2) % 5 for i in range(n)]  # 2, 0, 3, 1, 4, 2, ...
    call = Call(collective="all_gather", algorithm="naive", n=n, sizes=tuple(sizes))
    inp, out = _data(sizes[r], r), [torch.empty(s) for s in sizes]
    k.run(f"all_gather naive uneven {sizes}", call,
          lambda: comm.all_gather(out, inp, group=g, algorithm="naive"),
          out, [_data(s, i) for i, s in enumerate(sizes)])
    call = Call(collective="reduce_scatter", algorithm="naive", n=n, sizes=tuple(sizes))
    parts, out = [_data(s, r, salt=i) for i, s in enumerate(sizes)], torch.empty(sizes[r])
    k.run(f"reduce_scatter naive uneven {sizes}", call,
          lambda: comm.reduce_scatter(out, parts, group=g, algorithm="naive"),
          out, sum(_data(sizes[r], i, salt=r) for i in range(n)))
    _all_to_all(k, [[(5 * i + 3 * j) % 4 for j in range(n)] for i in range(n)], torch.float32, "uneven")
    _all_to_all(k, [[LARGE if (i + j) % 3 == 0 else 0 for j in range(n)] for i in range(n)], torch.int64,
                "large sparse")


def _segmented(k):
    """van de Geijn broadcast whose ring all-gather cuts each chunk into two pipelining segments."""
    g, n, r = k.group, k.n, k.rank
    count = n * (SEGMENT_BYTES // 4 + 999)
    t, ref = _data(count, r), _data(count, r)
    dist.broadcast(ref, n - 1, group=g)
    k.run(f"broadcast scatter_allgather segmented {count}",
          call_for("broadcast", "scatter_allgather", n, count, 4, n - 1),
          lambda: comm.broadcast(t, n - 1, group=g, algorithm="scatter_allgather"), t, ref)


def _world(group):
    k = _Cases(group)
    n = k.n
    if n in (3, 4):
        _segmented(k)
    for count in sorted({0, 1, n - 1, LARGE}):
        for dtype in DTYPES if count else DTYPES[:1]:  # an empty buffer moves nothing in any dtype
            _whole_buffer(k, count, dtype)
            _sharded(k, count, dtype)
            _all_to_all(k, [[count] * n for _ in range(n)], dtype, f"even {count}")
    _uneven(k)
    return k.failures


@pytest.mark.parametrize("world", WORLDS)
def test_naive_pairwise_scatter_allgather(pool, world):
    failures = [f for rank_failures in pool.run(_world, world=world) for f in rank_failures]
    assert not failures, "\n".join(failures[:20])


def test_scatter_schedule_covers_every_chunk_once():
    """The binomial scatter hands each relative rank its subtree, and each chunk arrives once."""
    for n in range(1, 17):
        got = {0: (0, n)}
        for v in range(n):  # a parent's relative rank is smaller than its children's
            recv, sends = scatter_schedule(n, v)
            assert (recv is None) == (v == 0)
            for peer, lo, hi in sends:
                assert lo == peer and got[v][0] <= lo < hi <= got[v][1]
                assert scatter_schedule(n, peer)[0] == (v, lo, hi)
                got[peer] = (lo, hi)
        assert sorted(got) == list(range(n))
