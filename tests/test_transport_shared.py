"""Tensors in shared memory (`comm.transport.shared`): messages cut from them go by reference.

Every algorithm of the reducing and gathering collectives gives the same bits, and the traffic
meter the same counts, whether its buffer is a plain tensor or a shared one (whose messages the
peers read in place, acknowledging each); references are really taken; a message read before its
receive is posted (the unexpected queue) arrives intact; no name is left in /dev/shm; and under
transport gloo the tensor is an ordinary one.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import transport
from ringzero.comm.registry import TABLE
from ringzero.comm.transport import hosts, layout, regions, segment, shared
from ringzero.plan.comm.algorithms import NODE_AWARE, fits

COUNTS = (70_001, 1_100_003)
"""Elements (float32): pieces of 64 KiB and more at 2-4 ranks (sent by reference), and more than a
channel's ring of 4 MiB."""


def _refs(group) -> int:
    """Messages this rank has sent by reference so far, over every channel of `group`."""
    return sum(o.n_refs for o in transport.p2p(group)._out.values())


def _names() -> list[str]:
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"rz-{hosts.token()}-") and "-reg-" in f]


def _run(coll: str, algo: str, buf: torch.Tensor, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    if coll == "all_reduce":
        comm.all_reduce(buf, group=group, algorithm=algo)
        return buf.clone()
    if coll == "broadcast":
        comm.broadcast(buf, 0, group=group, algorithm=algo)
        return buf.clone()
    if coll == "reduce":
        comm.reduce(buf, 0, group=group, algorithm=algo)
        return buf.clone() if dist.get_rank(group) == 0 else torch.empty(0)
    out = torch.empty(len(buf) // n if coll == "reduce_scatter" else len(buf) * n)
    if coll == "reduce_scatter":
        comm.reduce_scatter_tensor(out, buf, group=group, algorithm=algo)
    else:
        comm.all_gather_into_tensor(out, buf, group=group, algorithm=algo)
    return out


def _shared_vs_plain(group) -> tuple[list[str], int, list[str]]:
    n, r = dist.get_world_size(group), dist.get_rank(group)
    bad = []
    with comm.configure(transport="shm"):
        before = _refs(group)
        for count in COUNTS:
            count -= count % n
            mine = shared.zeros(count, torch.float32, group)
            for coll in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"):
                for algo in TABLE[coll]:
                    if not fits(algo, n, None) or algo in NODE_AWARE:
                        continue
                    x = torch.randn(count, generator=torch.Generator().manual_seed(count + 7 * r))
                    mine.copy_(x)
                    got = {}
                    for name, buf in (("plain", x.clone()), ("shared", mine)):
                        with comm.TrafficMeter() as meter:
                            got[name] = (_run(coll, algo, buf, group), meter.total())
                    if not torch.equal(got["plain"][0].view(torch.int32), got["shared"][0].view(torch.int32)):
                        bad.append(f"n={n} {coll} {algo} count={count}: results differ")
                    if got["plain"][1] != got["shared"][1]:
                        bad.append(f"n={n} {coll} {algo}: meter {got['plain'][1]} vs {got['shared'][1]}")
            del mine
        refs = _refs(group) - before
    dist.barrier(group)
    return bad, refs, _names()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shared_tensors_give_the_bits_of_plain_ones_and_go_by_reference(pool, world):
    results = pool.run(_shared_vs_plain, world=world)
    bad = [b for rank_bad, _, _ in results for b in rank_bad]
    assert not bad, f"{len(bad)} differences, first: {bad[0]}"
    assert all(refs > 0 for _, refs, _ in results)
    assert not [name for _, _, names in results for name in names]


def _early(group) -> bool:
    """Rank 0 sends two references, tags 1 then 2; rank 1 receives tag 2 first, so tag 1 is read
    aside (after its acknowledgement rank 0 may overwrite its tensor) and then delivered."""
    with comm.configure(transport="shm"):
        t = shared.zeros(2 * 40_000, torch.float32, group)
        t.copy_(torch.arange(2 * 40_000, dtype=torch.float32))
        pg = transport.p2p(group)
        if dist.get_rank(group) == 0:
            works = [pg.send([t[:40_000]], 1, 1), pg.send([t[40_000:]], 1, 2)]
            for w in works:
                w.wait()
            t.fill_(-1.0)                           # acknowledged: the peer has its copy
            ok = pg._out[1].n_refs >= 2
        else:
            a, b = torch.empty(40_000), torch.empty(40_000)
            pg.recv([b], 0, 2).wait()
            pg.recv([a], 0, 1).wait()
            ok = torch.equal(torch.cat([a, b]), torch.arange(2 * 40_000, dtype=torch.float32))
    dist.barrier(group)
    return ok


def test_a_reference_read_before_its_receive_is_posted_arrives_intact(pool):
    assert pool.run(_early, world=2) == [True, True]


def _plain_under_gloo(group) -> tuple[bool, bool]:
    with comm.configure(transport="gloo"):
        t = shared.zeros(1 << 20, torch.float32, group)
    return regions.find(t.data_ptr(), t.numel() * 4, 1 - dist.get_rank(group)) is None, bool(torch.all(t == 0))


def test_under_gloo_a_shared_tensor_is_a_plain_one(pool):
    assert pool.run(_plain_under_gloo, world=2) == [(True, True), (True, True)]


def _small_shm(group) -> tuple[bool, bool]:
    """A /dev/shm with room for the tensor but not for the channels besides: every rank plain."""
    real = segment.free_bytes
    segment.free_bytes = lambda: 2 * (1 << 20) + layout.channels_bytes([dist.get_world_size(group)]) - 1
    try:
        with comm.configure(transport="shm"):
            t = shared.zeros(1 << 18, torch.float32, group)
    finally:
        segment.free_bytes = real
    return regions.find(t.data_ptr(), t.numel() * 4, 1 - dist.get_rank(group)) is None, not _names()


def test_a_dev_shm_without_room_for_the_channels_besides_gives_plain_tensors(pool):
    assert pool.run(_small_shm, world=2) == [(True, True), (True, True)]
