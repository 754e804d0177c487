"""A worker's side of the parameter server: push the gradient, pull the parameters, by key range.

The worker's parameters are its data-parallel strategy's flat buckets, taken in order as one key
space of n elements; server s owns [lo_s, hi_s) of it (`plan.strategies.param_server.server_ranges`), which may
cut through buckets. A step's push sends each server its range of the gradient (one message, the
pieces copied into a staging buffer), and the pull receives the range's new values into another and
copies them back into the buckets. Messages and their meter keys are `parallel.ps.server`'s.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import PS
from ringzero.comm.point_to_point import post
from ringzero.plan.strategies.param_server import server_ranges
from ringzero.parallel.ps.server import (CONTROL, HEADER, PULLED, PUSH, PUSHED, STOP, TAG_GRAD, TAG_HEADER, TAG_PARAMS,
                        TAG_REPLY)


def pieces(sizes: Sequence[int], lo: int, hi: int) -> list[tuple[int, int, int, int]]:
    """(bucket, start, end, offset in the range) of the buckets of `sizes` (consecutive in the key
    space) that [lo, hi) covers, in order."""
    out, base = [], 0
    for b, n in enumerate(sizes):
        a, z = max(lo, base), min(hi, base + n)
        if a < z:
            out.append((b, a - base, z - base, a - lo))
        base += n
    return out


class PSClient:
    """Push and pull `weights` (flat buckets, updated in place) against `servers`, group ranks of
    `group` in key-range order."""

    def __init__(self, weights: list[torch.Tensor], servers: Sequence[int], group) -> None:
        self.weights, self.servers, self.group = weights, list(servers), group
        sizes = [w.numel() for w in weights]
        self.ranges = server_ranges(sum(sizes), len(self.servers))
        self.cuts = [pieces(sizes, lo, hi) for lo, hi in self.ranges]
        dtype = weights[0].dtype
        self.push_buf = [torch.empty(hi - lo, dtype=dtype) for lo, hi in self.ranges]
        self.pull_buf = [torch.empty(hi - lo, dtype=dtype) for lo, hi in self.ranges]
        self.read = [0] * len(self.servers)
        """The clock each server's latest answer carried: what the next push says it computed on."""
        self.headers = [torch.empty(HEADER, dtype=torch.float64) for _ in self.servers]
        self.replies = [torch.empty(2, dtype=torch.float64) for _ in self.servers]

    @tagged(PS)
    def push_pull(self, grads: list[torch.Tensor], step: int) -> tuple[float, float]:
        """Send every server its range of `grads` (this worker's summed gradient of `step`) and take
        back the range's new values. Returns (blocked, held): the seconds blocked for the answers
        after the pushes were posted (the transfers, the server's update and, under sync or ssp,
        the slower workers), and of those the most any server held this push for its peers
        (`ps_server`'s `held`: the wait for the others, timed where it happens)."""
        sq = sum(float(torch.linalg.vector_norm(g, dtype=torch.float32)) ** 2 for g in grads)
        sends, recvs = [], []
        for i, server in enumerate(self.servers):
            for b, a, z, off in self.cuts[i]:
                self.push_buf[i][off:off + z - a].copy_(grads[b][a:z])
            self.headers[i].copy_(torch.tensor([PUSH, float(step), float(self.read[i]), sq], dtype=torch.float64))
            sends += post(sends=[(server, self.headers[i])], group=self.group, tag=TAG_HEADER, key=CONTROL,
                          backend=True)[0]
            sends += post(sends=[(server, self.push_buf[i])], group=self.group, tag=TAG_GRAD, key=PUSHED)[0]
            recvs += post(recvs=[(server, self.replies[i])], group=self.group, tag=TAG_REPLY, key=CONTROL)[1]
            recvs += post(recvs=[(server, self.pull_buf[i])], group=self.group, tag=TAG_PARAMS, key=PULLED)[1]
        t0 = time.perf_counter()
        for w in (*sends, *recvs):
            w.wait()
        waited = time.perf_counter() - t0
        with torch.no_grad():
            for i in range(len(self.servers)):
                self.read[i] = int(self.replies[i][0])
                for b, a, z, off in self.cuts[i]:
                    self.weights[b][a:z].copy_(self.pull_buf[i][off:off + z - a])
        return waited, max(float(r[1]) for r in self.replies)

    @tagged(PS)
    def stop(self) -> None:
        """Tell every server this worker is done (after its last pull)."""
        works = []
        for i, server in enumerate(self.servers):
            self.headers[i].copy_(torch.tensor([STOP, 0.0, 0.0, 0.0], dtype=torch.float64))
            works += post(sends=[(server, self.headers[i])], group=self.group, tag=TAG_HEADER, key=CONTROL,
                          backend=True)[0]
        for w in works:
            w.wait()
