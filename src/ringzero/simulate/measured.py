"""A run's measured rates in place of a GPU's roofline: what `simulate_step` takes to play a step of
ringzero's own CPU ranks (`twin.simulated`).

- compute: a block's training FLOPs (`plan.model.flops`) at the FLOP/s the run's probe measured,
  forward a third of them without recomputation (2 of 6 per parameter), backward the rest with what
  is recomputed; the head's matmul on the last chunk, and the parameters outside the blocks and the
  head (position table, final norm) on the first, 6 per parameter per token as the run counts them;
- each collective: its host seconds (a function of the call, the probe's timing of it) added to
  its schedule's time on the links;
- the engine's own gradient buckets and weight all-gathers, in place of the planner's cut;
- `inline`: the gradient collectives take the compute's time (the communication thread of a CPU
  rank runs on the cores backward uses) instead of running beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ringzero.plan.model.flops import layer_flops_per_token
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.pipeline.layout import head_flops_per_token


@dataclass(frozen=True)
class Measured:
    """A run's measured rates in place of the hardware's roofline."""

    flops: float
    """FLOP/s of a block (forward, backward and what is recomputed alike)."""
    optimizer_s_per_param: float
    host: Callable[[str, str, str, int, int, int], float]
    """(dim, collective, algorithm, ranks, elements, itemsize) -> the host's seconds of one call,
    added to its links' played time."""
    buckets: tuple[int, ...] | None = None
    """The engine's gradient buckets (elements each) of a one-stage run, in place of the cut by
    `bucket_mb`."""
    gathers: tuple[int, ...] | None = None
    """The engine's weight all-gathers after the update (ZeRO-1/2: one per bucket), in place of one
    of the whole shard."""
    inline: bool = True
    """Whether the gradient collectives take the compute's time instead of running beside it (CPU
    ranks: the communication thread runs on the cores backward uses)."""

    def compute(self, m: ModelShape, b: int, tp: int, recompute: str) -> tuple[float, float, float, float]:
        """(block forward, block backward, head forward, head backward) seconds of one micro-batch
        on one tp rank: forward a third of the block's training FLOPs without recomputation (2 of
        6 per parameter), backward the rest with what `recompute` runs again."""
        tokens = b * m.seq / tp
        fwd = layer_flops_per_token(m) / 3 * tokens / self.flops
        head = head_flops_per_token(m) * tokens / self.flops
        return fwd, layer_flops_per_token(m, recompute) * tokens / self.flops - fwd, head / 3, head * 2 / 3

    def embeddings(self, m: ModelShape, b: int, tp: int) -> tuple[float, float]:
        """(forward, backward) seconds of the parameters outside the blocks and the head's matmul
        (the position table, the final norm, an untied embedding) on the first chunk, counted as
        the run's own FLOPs are, 6 per parameter per token (`plan.model.flops`)."""
        rest = param_count(m).total - m.layers * param_count(m).per_layer - m.hidden * m.vocab
        seconds = 6.0 * max(0, rest) * b * m.seq / tp / self.flops
        return seconds / 3, seconds * 2 / 3
