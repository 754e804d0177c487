"""What a communication hook is given: one bucket of gradients, and the collectives it may call.

`GradBucket` is DDP's `dist.GradBucket` in ringzero's terms: the bucket's flat gradient (this
rank's, summed over its micro-batches), the parameters' slots in it, and under ZeRO-1/2 the shard
the reduction must fill. `Link` runs `ringzero.comm`'s collectives on the dp group with the
strategy's algorithms (so the traffic meter counts them) and keeps the seconds they took, so that
the hook's own compute is the rest; `LocalLink` stands in for it where only the compute is wanted
(the in-run probe of a hook: `train.probe`), moving nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ringzero import comm


@dataclass
class GradBucket:
    index: int
    buffer: torch.Tensor
    """(padded,) this rank's gradient; the hook leaves the sum over the dp ranks in [:numel]."""
    offsets: list[int]
    shapes: list[torch.Size]
    shard: torch.Tensor | None = None
    """ZeRO-1/2: (padded / dp,) where a hook that scatters (`CommHook.scatters`) puts this rank's
    summed shard instead; None under DP."""
    finite: bool | None = None
    """Whether `buffer` holds no inf or NaN (the strategy checked it for the loss scaler); None:
    not known."""
    shared: bool = False
    """Reduced alike by ranks of other dp groups (a pipeline's tied embedding, on its first and last
    stage), so what a hook draws for it cannot depend on the buckets around it."""

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    def gradients(self) -> list[torch.Tensor]:
        """Views of `buffer` shaped like each parameter (DDP's `GradBucket.gradients`)."""
        return [self.buffer[lo:hi].view(s) for lo, hi, s in zip(self.offsets, self.offsets[1:], self.shapes)]


class Link:
    """The dp group's collectives, timed."""

    def __init__(self, group, world: int, algorithm_for) -> None:
        self.group, self.world, self.algorithm_for = group, world, algorithm_for
        self.seconds = 0.0

    def _timed(self, fn, *args, collective: str, **kw) -> None:
        t0 = time.perf_counter()
        fn(*args, group=self.group, algorithm=self.algorithm_for(collective), **kw)
        self.seconds += time.perf_counter() - t0

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sum `t` over the ranks, in place."""
        self._timed(comm.all_reduce, t, op="sum", collective="all_reduce")

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._timed(comm.reduce_scatter_tensor, out, inp, op="sum", collective="reduce_scatter")

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Every rank's `inp`, in rank order, into `out` (world x inp)."""
        self._timed(comm.all_gather_into_tensor, out, inp, collective="all_gather")


class LocalLink:
    """A link of `world` ranks that all hold this one's tensors: the hook's compute, nothing sent."""

    def __init__(self, world: int) -> None:
        self.world, self.seconds = world, 0.0

    def all_reduce(self, t: torch.Tensor) -> None:
        pass

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        out.copy_(inp[:out.numel()])

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        out.view(self.world, -1).copy_(inp.view(1, -1).expand(self.world, -1))
