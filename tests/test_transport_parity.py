"""Shared memory against gloo: the same algorithm code gives bit-identical results on either transport.

Every collective x algorithm x world size 1-8 x element count (0, fewer than the
world, odd, and one large enough to fill many slots and overflow a channel's ring) x dtype x op x
root, with random inputs, plus uneven lists, non-contiguous tensors and a strided renumbered
sub-group: each case runs once over gloo's point-to-point and once over shared memory on the same
inputs, and the outputs must agree bit for bit, and so must the traffic meter's counts (bytes,
messages, rounds), which are the algorithm's and not the transport's. A few steps of DP and of
ZeRO-3 training give the same losses on either transport, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import transport
from ringzero.comm.ops import Op
from ringzero.comm.registry import TABLE
from ringzero.plan.comm.algorithms import NODE_AWARE, fits

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
BIG = 1_100_003
"""Elements (float32) of the large case: 4.4 MB, more than one channel's ring of 4 MiB."""
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
         torch.float16: torch.int16}


def _data(seed: int, count: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(count, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(count, generator=g).to(dtype)
    return torch.randint(-50, 50, (count,), generator=g).to(dtype)


def _call(coll, algo, group, dtype, op, count, root, seed) -> list[torch.Tensor]:
    """One call of `coll` on random inputs; the tensors it wrote (uneven list forms included)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    s = seed * 131 + r
    if coll == "all_reduce":
        x = _data(s, 2 * count, dtype)[::2]                    # non-contiguous
        comm.all_reduce(x, op=op, group=group, algorithm=algo)
        return [x]
    if coll == "reduce":
        x = _data(s, count, dtype)
        comm.reduce(x, root, op=op, group=group, algorithm=algo)
        return [x]
    if coll == "broadcast":
        x = _data(s, 2 * count, dtype)[::2]
        comm.broadcast(x, root, group=group, algorithm=algo)
        return [x]
    if coll == "all_gather":
        out = torch.empty(n * count, dtype=dtype)
        comm.all_gather_into_tensor(out, _data(s, count, dtype), group=group, algorithm=algo)
        lst = [torch.empty(i % 3 + count, dtype=dtype) for i in range(n)]
        comm.all_gather(lst, _data(s + 1, r % 3 + count, dtype), group=group, algorithm=algo)
        return [out, *lst]
    if coll == "reduce_scatter":
        out = torch.empty(count, dtype=dtype)
        comm.reduce_scatter_tensor(out, _data(s, n * count, dtype), op=op, group=group, algorithm=algo)
        sizes = [i % 3 + count for i in range(n)]
        mine = torch.empty(sizes[r], dtype=dtype)
        comm.reduce_scatter(mine, [_data(s + 7 * i, sizes[i], dtype) for i in range(n)], op=op, group=group,
                            algorithm=algo)
        return [out, mine]
    if coll == "gather":
        got = [torch.empty(count, dtype=dtype) for _ in range(n)] if r == root else None
        comm.gather(_data(s, count, dtype), got, dst=root, group=group, algorithm=algo)
        return got or []
    if coll == "scatter":
        x = torch.empty(count, dtype=dtype)
        comm.scatter(x, [_data(s + i, count, dtype) for i in range(n)] if r == root else None, src=root,
                     group=group, algorithm=algo)
        return [x]
    if coll == "all_to_all":
        outs = [torch.empty((i + r) % 3 + count, dtype=dtype) for i in range(n)]
        comm.all_to_all(outs, [_data(s + j, (r + j) % 3 + count, dtype) for j in range(n)], group=group,
                        algorithm=algo)
        return outs
    raise ValueError(coll)


def _cases(n: int, rpn):
    """(collective, algorithm, dtype, op, count, root) of world n."""
    out = []
    for coll, algos in TABLE.items():
        for algo in algos:              # not "auto": it prices each transport by its own costs
            if not fits(algo, n, rpn) or (algo in NODE_AWARE and rpn is None):
                continue
            dtypes = (torch.float32, torch.bfloat16, torch.int64) if coll in REDUCING else (torch.float32, torch.uint8)
            if n >= 5:                  # the dtypes go through the same bytes at 2-4 ranks
                dtypes = dtypes[:1]
            for dtype in dtypes:
                ops = [None]
                if coll in REDUCING:
                    ops = [op for op in Op if op is not Op.AVG or dtype.is_floating_point]
                    ops = ops if (coll, algo) == ("all_reduce", "ring") else ops[:2]
                counts = [0, max(1, n - 1), 2 * n + 3]
                if dtype == torch.float32 and coll in ("all_reduce", "all_gather") and algo == "ring":
                    counts.append(BIG // (n if coll == "all_gather" else 1))
                for op in ops:
                    for count in counts:
                        for root in sorted({0, n - 1}) if coll in ("reduce", "broadcast", "gather", "scatter") else [0]:
                            out.append((coll, algo, dtype, op, count, root))
    return out


def _both(group, rpn) -> list[str]:
    n = dist.get_world_size(group)
    got, traffic = {}, {}
    for mode in ("gloo", "shm"):
        with comm.configure(transport=mode, ranks_per_node=rpn), comm.TrafficMeter() as meter:
            got[mode] = [_call(c, a, group, d, op, k, root, i) for i, (c, a, d, op, k, root) in enumerate(_cases(n, rpn))]
        traffic[mode] = meter.total()
    with comm.configure(transport="shm"):
        used = transport.in_use(group)
    bad = []
    for case, x, y in zip(_cases(n, rpn), got["gloo"], got["shm"]):
        same = len(x) == len(y) and all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.view(_BITS[a.dtype]) if a.dtype in _BITS else a, b.view(_BITS[b.dtype]) if b.dtype in _BITS else b)
            for a, b in zip(x, y))
        if not same:
            bad.append(f"n={n} {case}")
    if traffic["gloo"] != traffic["shm"]:
        bad.append(f"n={n} meter: gloo {traffic['gloo']} shm {traffic['shm']}")
    return bad, used


@pytest.mark.parametrize("world", range(1, 9))
def test_shm_results_equal_gloo_bit_for_bit(pool, world):
    results = pool.run(_both, None, world=world)
    bad = [b for rank_bad, _ in results for b in rank_bad]
    assert not bad, f"{len(bad)} differences, first: {bad[0]}"
    assert {used for _, used in results} == ({"shm"} if world > 1 else {"shm", "gloo"} & {results[0][1]})


def test_hierarchical_algorithms_equal_on_both_transports(pool):
    results = pool.run(_both, 2, world=4)        # two nodes of two
    bad = [b for rank_bad, _ in results for b in rank_bad]
    assert not bad, f"{len(bad)} differences, first: {bad[0]}"


_STRIDED: dict = {}


def _strided(_group, members):
    if members not in _STRIDED:                 # every rank of the pool makes the group, once
        _STRIDED[members] = dist.new_group(list(members))
    if dist.get_rank() not in members:
        return [], None
    return _both(_STRIDED[members], None)


def test_strided_renumbered_subgroup_equal_on_both_transports(pool):
    results = pool.run(_strided, (7, 2, 5, 0), world=8)
    bad = [b for rank_bad, _ in results for b in rank_bad]
    assert not bad, f"{len(bad)} differences, first: {bad[0]}"
    assert {used for _, used in results if used} == {"shm"}


def _losses(group, cfg):
    from ringzero.train.rank import train_rank
    return train_rank(cfg, group=group, calibrate=False).losses


@pytest.mark.parametrize("strategy", ["dp", "zero3"])
def test_training_on_either_transport_gives_the_same_losses_bit_for_bit(pool, strategy):
    from ringzero.run.config import TrainConfig
    base = dict(model="nano", strategy=strategy, steps=4, comm_algorithm="ring", eval_every=10**6, max_bytes=2**16)
    gloo, shm = (pool.run(_losses, TrainConfig(**base, transport=t), world=2) for t in ("gloo", "shm"))
    assert gloo == shm and gloo[0]
