import torch
import torch.distributed as dist

from ringzero import comm


def _ring(group, count):
    r = dist.get_rank(group)
    t = torch.arange(count, dtype=torch.float32) % 5 + r
    ref = t.clone()
    dist.all_reduce(ref, group=group)
    comm.all_reduce(t, group=group, algorithm="ring")
    return torch.equal(t, ref)


def test_ring_on_every_world(pool):
    for world in (1, 2, 3, 5, 8):
        assert all(pool.run(_ring, 1001, world=world))
