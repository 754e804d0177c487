"""Dropout under tensor parallelism: Megatron's RNG-state tracker, on the CPU generator.

Dropout must draw the same mask on every tp rank where the activations are replicated (after the
row-parallel projections, on the embedding output), or the ranks' copies drift apart; and different
masks where each rank holds a different part of the tensor (the attention probabilities, sharded by
heads; under sequence parallelism every activation between regions, sharded by tokens), or the
shards' masks are copies of one another (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2.2).
Megatron-LM keeps two states (`megatron/core/tensor_parallel/random.py`,
`model_parallel_cuda_manual_seed`): the default generator, seeded alike on every tp rank, and a
"model-parallel" state seeded `seed + 2718 + tp_rank`, entered around the sharded regions with
`tracker.fork()`.

`RNGTracker.fork` swaps the CPU generator's state for the tracked one (`torch.random.fork_rng`), so
the default stream does not advance inside the region and every rank leaves it with the same default
state. `RNGFork(module, tracker)` runs a module inside the fork.

Recomputation: a checkpointed region re-run in backward must draw the masks of its forward. torch's
checkpoint restores the default state; if the fork is inside the checkpointed module, the tracked
state must be restored too: pass `context_fn=tracker.checkpoint_context` to
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` (Megatron's `CheckpointFunction` saves
and restores the tracker's states for the same reason). A fork outside the checkpointed module
(`RNGFork(Checkpointed(core))`) needs nothing: the checkpoint saves the forked state itself.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from torch import nn

MODEL_PARALLEL = "model-parallel-rng"
"""The tracked state's name (Megatron's `_MODEL_PARALLEL_RNG_TRACKER_NAME`)."""

SEED_OFFSET = 2718
"""Megatron's offset of the model-parallel seed from the base seed (`model_parallel_cuda_manual_seed`)."""


class RNGTracker:
    """Named CPU generator states, each entered with `fork(name)`."""

    def __init__(self) -> None:
        self.states: dict[str, torch.Tensor] = {}

    @classmethod
    def model_parallel(cls, seed: int, tp_rank: int) -> "RNGTracker":
        """Megatron's tracker: one state, seeded `seed + 2718 + tp_rank`."""
        tracker = cls()
        tracker.add(MODEL_PARALLEL, seed + SEED_OFFSET + tp_rank)
        return tracker

    def add(self, name: str, seed: int) -> None:
        if name in self.states:
            raise ValueError(f"RNG state {name!r} already exists")
        self.states[name] = torch.Generator().manual_seed(seed).get_state()

    @contextmanager
    def fork(self, name: str = MODEL_PARALLEL):
        """Run the body on the tracked state `name`; the default state is left as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.states[name])
            try:
                yield
            finally:
                self.states[name] = torch.get_rng_state()

    def checkpoint_context(self):
        """A `context_fn` for non-reentrant checkpoint: the re-run in backward starts from the tracked
        states of the forward, and the states after it are those before it."""
        saved = {k: v.clone() for k, v in self.states.items()}

        @contextmanager
        def recompute():
            now = dict(self.states)
            self.states.update({k: v.clone() for k, v in saved.items()})
            try:
                yield
            finally:
                self.states.update(now)

        return nullcontext(), recompute()


class RNGFork(nn.Module):
    """Runs `inner` on the tracker's model-parallel state (a sharded region's dropout)."""

    def __init__(self, inner: nn.Module, tracker: RNGTracker) -> None:
        super().__init__()
        self.inner, self.tracker = inner, tracker

    def forward(self, *args):
        with self.tracker.fork():
            return self.inner(*args)
