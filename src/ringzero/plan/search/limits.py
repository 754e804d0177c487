"""The largest inputs the planner takes, so that every plan answers in about a second.

The planner's pure formulas are O(1) in the counts, but a pipeline is priced stage by stage and
schedule by schedule: the busiest stage looks at every one of the p stages, and each stage's
activations are played through its m micro-batches (`pipeline.held_counts`, O(m·v)); the
recommendation and the search try every pp dividing the layers. These bounds keep that work small
while staying far above any model or cluster trained to date (the deepest published dense models
have about 128 blocks; the largest runs tens of thousands of GPUs).
"""

from __future__ import annotations

MAX_LAYERS = 1024
"""Transformer blocks: 8x Megatron-LM's 1T-parameter GPT (128 blocks, Narayanan et al. 2021 Table 1)."""
MAX_GPUS = 10**9
"""GPUs in all (counts past 2⁶³ would also overflow the byte counts' integer ranges)."""
MAX_MICRO_BATCHES = 8 * MAX_LAYERS
"""Micro-batches per step of one data-parallel rank (the pipeline's m) that a pipeline's schedule
is played for: the search's default batch (one micro-batch per GPU) gives a split tp·pp of them,
up to 8 x MAX_LAYERS on nodes of 8 GPUs."""


def check(layers: int, gpus: int, micro_batches: int | None = None, *, flags: bool = False) -> None:
    """A one-line ValueError naming the first count over its limit and the limit; `micro_batches`
    (with a pipeline) is checked when given. `flags`: name them as `ringzero plan`'s flags."""
    for value, limit, flag, noun in (
            (layers, MAX_LAYERS, "--layers", "layers"), (gpus, MAX_GPUS, "--gpus", "GPUs"),
            (micro_batches, MAX_MICRO_BATCHES, None, "micro-batches per step on a pipeline")):
        if value is None or value <= limit:
            continue
        what = f"{flag} {value}" if flags and flag else f"{value:,} {noun}"
        if flags and flag is None:
            what += " (--global-batch / (--micro-batch x dp))"
        raise ValueError(f"{what} is more than the planner takes: at most {limit:,} {noun} (so that a plan "
                         "answers in about a second)")
