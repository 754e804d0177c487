"""One case of each collective, run against torch.distributed's own collective on the same group.

Inputs are small integers (as nccl-tests does), so every sum, min, max and product is exact in
every dtype and results compare bit for bit. Each function returns None or a one-line failure.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import backend
from ringzero.comm.ops import Op


def make(rank: int, count: int, dtype, op: Op | None = None, salt: int = 0) -> torch.Tensor:
    """Rank-dependent small integers; values in {1, 2} for products so n <= 8 stays exact in bf16."""
    base = torch.arange(count, dtype=torch.int64) * 7 + rank * 3 + salt
    vals = base % 2 + 1 if op is Op.PRODUCT else base % 4
    return vals.to(dtype)


def _strided(t: torch.Tensor, noncontig: bool) -> torch.Tensor:
    """The same values laid out non-contiguously (every other element of a buffer twice as long)."""
    if not noncontig:
        return t
    big = torch.full((t.numel() * 2,), -99, dtype=t.dtype)
    big[::2] = t
    return big[::2]


def _ref_op(op: Op):
    return dist.ReduceOp.SUM if op is Op.AVG else getattr(dist.ReduceOp, op.name)


def _fail(what, got, want) -> str:
    return f"{what}: got {got.reshape(-1)[:6].tolist()} want {want.reshape(-1)[:6].tolist()}"


def case(group, coll: str, algo: str, count: int, dtype, op: Op | None, root: int, noncontig: bool):
    r, n = dist.get_rank(group), dist.get_world_size(group)
    what = f"{coll}/{algo} n={n} count={count} {dtype} {op and op.value} root={root} nc={noncontig}"
    groot = dist.get_global_rank(group, root)
    if coll == "all_reduce":
        x = _strided(make(r, count, dtype, op), noncontig)
        want = make(r, count, dtype, op)
        dist.all_reduce(want, op=_ref_op(op), group=group)
        if op is Op.AVG:
            want.div_(n)
        comm.all_reduce(x, op=op, group=group, algorithm=algo)
        return None if torch.equal(x, want) else _fail(what, x, want)
    if coll == "reduce":
        x = _strided(make(r, count, dtype, op), noncontig)
        want = make(r, count, dtype, op)
        dist.reduce(want, groot, op=_ref_op(op), group=group)
        if op is Op.AVG:
            want.div_(n)
        comm.reduce(x, root, op=op, group=group, algorithm=algo)
        if r != root:
            want = make(r, count, dtype, op)  # non-root input is left as it was
        return None if torch.equal(x, want) else _fail(what, x, want)
    if coll == "broadcast":
        x = _strided(make(r, count, dtype), noncontig)
        want = make(root, count, dtype)
        comm.broadcast(x, root, group=group, algorithm=algo)
        return None if torch.equal(x, want) else _fail(what, x, want)
    if coll == "all_gather":
        x = make(r, count, dtype)
        want = torch.empty(n * count, dtype=dtype)
        backend.all_gather_single(want, x, group=group)
        out = torch.full((n * count,), -1, dtype=dtype)
        comm.all_gather_into_tensor(out, x, group=group, algorithm=algo)
        if not torch.equal(out, want):
            return _fail(what + " into_tensor", out, want)
        # uneven list form: rank i contributes i % 3 + count elements
        sizes = [count] * n if algo == "torch" else [i % 3 + count for i in range(n)]
        lst = [torch.full((s,), -1, dtype=dtype) for s in sizes]
        comm.all_gather(lst, make(r, sizes[r], dtype), group=group, algorithm=algo)
        for i, t in enumerate(lst):
            if not torch.equal(t, make(i, sizes[i], dtype)):
                return _fail(what + f" list[{i}]", t, make(i, sizes[i], dtype))
        return None
    if coll == "reduce_scatter":
        x = make(r, n * count, dtype, op)
        want = torch.empty(count, dtype=dtype)
        backend.reduce_scatter_single(want, x.clone(), op=_ref_op(op), group=group)
        if op is Op.AVG:
            want.div_(n)
        out = torch.full((count,), -1, dtype=dtype)
        comm.reduce_scatter_tensor(out, x, op=op, group=group, algorithm=algo)
        if not torch.equal(out, want):
            return _fail(what + " tensor", out, want)
        if not torch.equal(x, make(r, n * count, dtype, op)):
            return what + ": input was modified"
        sizes = [count] * n if algo == "torch" else [i % 3 + count for i in range(n)]
        inputs = [make(r * n + i, sizes[i], dtype, op) for i in range(n)]
        out = torch.full((sizes[r],), -1, dtype=dtype)
        comm.reduce_scatter(out, inputs, op=op, group=group, algorithm=algo)
        expect = [make(j * n + r, sizes[r], dtype, op) for j in range(n)]
        want = expect[0].clone()
        for e in expect[1:]:
            want = {Op.SUM: torch.add, Op.AVG: torch.add, Op.MIN: torch.minimum,
                    Op.MAX: torch.maximum, Op.PRODUCT: torch.mul}[op](want, e)
        if op is Op.AVG:
            want = want / n
        return None if torch.equal(out, want.to(dtype)) else _fail(what + " list", out, want)
    if coll == "gather":
        x = make(r, count, dtype)
        got = [torch.full((count,), -1, dtype=dtype) for _ in range(n)] if r == root else None
        comm.gather(x, got, dst=root, group=group, algorithm=algo)
        if r == root:
            for i, t in enumerate(got):
                if not torch.equal(t, make(i, count, dtype)):
                    return _fail(what + f" [{i}]", t, make(i, count, dtype))
        return None
    if coll == "scatter":
        pieces = [make(i + 10, count, dtype) for i in range(n)] if r == root else None
        x = torch.full((count,), -1, dtype=dtype)
        comm.scatter(x, pieces, src=root, group=group, algorithm=algo)
        want = make(r + 10, count, dtype)
        return None if torch.equal(x, want) else _fail(what, x, want)
    if coll == "all_to_all":
        # uneven: rank i sends (i + j) % 3 + count elements to rank j
        size = (lambda i, j: count) if algo == "torch" else (lambda i, j: (i + j) % 3 + count)  # noqa: E731
        ins = [make(r * 100 + j, size(r, j), dtype) for j in range(n)]
        outs = [torch.full((size(i, r),), -1, dtype=dtype) for i in range(n)]
        comm.all_to_all(outs, ins, group=group, algorithm=algo)
        for i, t in enumerate(outs):
            want = make(i * 100 + r, size(i, r), dtype)
            if not torch.equal(t, want):
                return _fail(what + f" from {i}", t, want)
        return None
    raise ValueError(coll)


def run_once(coll: str, algo: str, g, n: int, r: int, count: int, root: int) -> None:
    """One call of `coll` with `algo` on ones of `count` elements per rank (the whole n-chunk buffer
    for the scattering collectives; `chunk_sizes(count, n)` per peer for all_to_all), root `root`:
    what the traffic tests meter."""
    from ringzero.plan.comm.chunks import chunk_sizes
    x = torch.ones(count)
    if coll == "all_reduce":
        comm.all_reduce(x, algorithm=algo, group=g)
    elif coll == "reduce":
        comm.reduce(x, root, algorithm=algo, group=g)
    elif coll == "broadcast":
        comm.broadcast(x, root, algorithm=algo, group=g)
    elif coll == "all_gather":
        comm.all_gather_into_tensor(torch.empty(n * count), x, algorithm=algo, group=g)
    elif coll == "reduce_scatter":
        comm.reduce_scatter_tensor(torch.empty(count), torch.ones(n * count), algorithm=algo, group=g)
    elif coll == "gather":
        comm.gather(x, [torch.empty(count) for _ in range(n)] if r == root else None, root, algorithm=algo, group=g)
    elif coll == "scatter":
        comm.scatter(x, [torch.ones(count) for _ in range(n)] if r == root else None, root, algorithm=algo, group=g)
    elif coll == "all_to_all":
        sizes = chunk_sizes(count, n)
        comm.all_to_all([torch.empty(sizes[r]) for _ in range(n)], [torch.ones(s) for s in sizes],
                        algorithm=algo, group=g)
    else:
        raise ValueError(f"unknown collective {coll!r}")
