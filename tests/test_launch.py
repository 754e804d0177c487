"""The launcher: results in rank order, and a failing, dying or hanging rank never hangs the run."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from ringzero import launch


def _sum_ranks():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def _rank1_raises():
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # the others wait for rank 1, which never arrives


def _rank2_dies():
    if dist.get_rank() == 2:
        os._exit(7)
    dist.barrier()


def _hangs():
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never joins
    else:
        time.sleep(3600)


def test_spawn_returns_results_in_rank_order():
    assert launch.spawn(_sum_ranks, 3, timeout=120) == [(r, 3, 3.0) for r in range(3)]


def test_a_raising_rank_stops_everyone_and_is_named():
    with pytest.raises(launch.RankError, match="rank 1 failed: ValueError: boom on purpose") as err:
        launch.spawn(_rank1_raises, 3, timeout=120)
    assert err.value.rank == 1


def test_a_dying_rank_is_named():
    with pytest.raises(launch.RankError, match=r"rank 2 died \(exit code 7\)"):
        launch.spawn(_rank2_dies, 3, timeout=120)


def test_timeout_names_the_unfinished_ranks():
    # The deadline counts from the spawn: ranks still starting or hanging are named the same way.
    with pytest.raises(launch.RankError, match=r"timed out after 5s; ranks \[0, 1\] had not finished"):
        launch.spawn(_hangs, 2, timeout=5)


def test_bad_nproc_is_rejected():
    with pytest.raises(ValueError, match="--nproc must be at least 1"):
        launch.spawn(_sum_ranks, 0)


def test_pool_survives_a_failing_job(pool):
    with pytest.raises(launch.RankError, match="rank 1 failed"):
        pool.run(_pool_rank1_raises, world=2, timeout=30)
    assert pool.run(_pool_rank, world=3) == [0, 1, 2]


def _pool_rank1_raises(group):
    if dist.get_rank(group) == 1:
        raise RuntimeError("job failure on purpose")
    dist.barrier(group=group)


def _pool_rank(group):
    return dist.get_rank(group)


def _many_tensors(x):
    # Rank r adds r to its own copy of `x`; torch's shared-memory pickling would hand every rank
    # (and the parent) one buffer, and tensors that outlive their sender only as file descriptors.
    x.add_(dist.get_rank())
    big = torch.arange(2**22, dtype=torch.float32)          # 16 MiB, far past a pipe's buffer
    return x, [torch.full((3,), float(i)) for i in range(200)], big, (big[:5], big[5:10])


def test_results_holding_many_tensors_come_back_after_the_rank_exits():
    x = torch.zeros(2)
    for r, (mine, small, big, views) in enumerate(launch.spawn(_many_tensors, 2, (x,), timeout=120)):
        assert torch.equal(mine, torch.full((2,), float(r)))
        assert [t.tolist() for t in small] == [[float(i)] * 3 for i in range(200)]
        assert torch.equal(big, torch.arange(2**22, dtype=torch.float32))
        assert views[0].untyped_storage().data_ptr() == views[1].untyped_storage().data_ptr()
    assert torch.equal(x, torch.zeros(2))          # the ranks wrote their own copies


_KEPT = {}


def _pool_keep(group):
    _KEPT["t"] = torch.zeros(3)
    return _KEPT["t"]


def _pool_bump(group):
    _KEPT["t"].add_(1)


def _pool_add_rank(group, x):
    x.add_(dist.get_rank(group))
    dist.barrier(group=group)              # every rank has written before any reads back
    return x


def test_pool_results_and_arguments_are_copies(pool):
    held = pool.run(_pool_keep, world=1)[0]
    pool.run(_pool_bump, world=1)                 # the rank writes the tensor it returned before
    assert torch.equal(held, torch.zeros(3))
    x = torch.zeros(2)
    assert [t.tolist() for t in pool.run(_pool_add_rank, x, world=3)] == [[0.0] * 2, [1.0] * 2, [2.0] * 2]
    assert torch.equal(x, torch.zeros(2))


def _pool_lambda(group):
    return lambda: None


def test_an_unpicklable_result_is_that_rank_error(pool):
    with pytest.raises(launch.RankError, match="rank 0 failed: .*(pickle|lambda)"):
        pool.run(_pool_lambda, world=2, timeout=30)
