"""The textbook communication formulas next to the exact traffic, per strategy, for one model
(the large-N and large-t limits of Patarasuk & Yuan 2009, Narayanan et al. 2021 §3.2 and
Rajbhandari et al. 2020 §7), and the memory of DP vs ZeRO-1/2/3 for the same run.

Pure data, no formatting: `ringzero plan` renders `strategy_comparison` as a table and plots
`memory_by_stage`. Φ is the gradient (= weight) bytes one model-parallel rank owns,
ceil(Ψ/(tp·pp)) parameters x the bytes of one value; b, s, h one micro-batch.

Each strategy is shown on the plan's own degree when it uses that strategy (dp, tp or pp > 1);
otherwise on all of the plan's GPUs (a "what if": the row says so; TP at most one node, PP at
most one stage per layer), so that every row is non-trivial. "Exact" is
`plan.comm.volume.volume` on rank 0 (the busiest rank: the root of naive), with the chunk
rounding and ZeRO's shard padding the meter sees.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ringzero.plan.comm.volume import call_for, volume
from ringzero.plan.config import Parallel, Training
from ringzero.plan.strategies.memory import Memory, memory, model_parallel_params
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.strategies.sharding import padded_numel
from ringzero.plan.strategies.traffic import seed_dp_bytes, seed_pp_bytes, seed_tp_bytes_per_layer


@dataclass(frozen=True)
class Row:
    """One strategy: the textbook formula's bytes and the exact bytes, over the same scope."""

    strategy: str
    group: int
    """N (data-parallel ranks), t (tensor-parallel ranks) or p (stages) of this row."""
    what_if: bool
    """True when the plan does not use the strategy and the row assumes all GPUs do."""
    scope: str
    """What the bytes count, e.g. "root, sent" or "per GPU, per layer per micro-batch"."""
    seed_formula: str
    seed_bytes: float
    exact_formula: str
    exact_bytes: float

    @property
    def ratio(self) -> float:
        """exact / formula (1.0 when both are 0)."""
        return self.exact_bytes / self.seed_bytes if self.seed_bytes else 1.0


def _degree(planned: int, gpus: int, limit=lambda d: True) -> tuple[int, bool]:
    """The plan's degree if > 1, else the largest valid degree <= gpus (at least 2). Callers cap
    `gpus` first (a node, the layers), so the search below is short whatever the GPU count."""
    if planned > 1:
        return planned, False
    d = max(2, gpus)
    while d > 2 and not limit(d):
        d -= 1
    return d, True


def _sent(collective: str, algorithm: str, n: int, count: int, itemsize: int, rank: int = 0) -> int:
    return volume(call_for(collective, algorithm, n, count, itemsize), rank).bytes_sent


def dp_rows(m: ModelShape, tr: Training, par: Parallel) -> list[Row]:
    """Naive and ring all-reduce, ZeRO-1/2 and ZeRO-3, each per step of one micro-batch."""
    n, what_if = _degree(par.dp, par.gpus)
    local = model_parallel_params(param_count(m).total, par.tp, par.pp)
    k = tr.bytes_per_value
    phi = local * k
    padded = padded_numel(local, n)
    root = _sent("all_reduce", "naive", n, local, k, 0)
    system = root + (n - 1) * _sent("all_reduce", "naive", n, local, k, 1)
    ring = _sent("all_reduce", "ring", n, local, k)
    rs = _sent("reduce_scatter", "ring", n, padded, k)
    ag = _sent("all_gather", "ring", n, padded, k)

    def row(name, scope, seed_f, seed_b, exact_f, exact_b):
        return Row(name, n, what_if, scope, seed_f, seed_b, exact_f, exact_b)

    return [
        row("DP naive all-reduce", "root, sent (and as much received)",
            "(N-1)·Φ", (n - 1) * phi, "(N-1)·Φ", root),
        row("DP naive all-reduce", "whole system, sent",
            "2·N·Φ", seed_dp_bytes(n, phi, "naive"), "2·(N-1)·Φ", system),
        row("DP ring all-reduce", "per GPU, sent",
            "2·(N-1)/N·Φ", seed_dp_bytes(n, phi, "ring"), "2·(N-1)/N·Φ (chunked)", ring),
        row("ZeRO-1/2", "per GPU, sent (reduce-scatter + all-gather)",
            "2·Φ", 2 * phi, "2·(N-1)/N·Φ (padded shards)", rs + ag),
        row("ZeRO-3", "per GPU, sent (reduce-scatter + 2 all-gathers)",
            "3·Φ", 3 * phi, "3·(N-1)/N·Φ (padded shards)", rs + 2 * ag),
    ]


def tp_row(m: ModelShape, tr: Training, par: Parallel, gpus_per_node: int = 8) -> Row:
    """Megatron-LM's four activation all-reduces of one layer, one micro-batch (a what-if group
    stays inside one node and divides the heads)."""
    t, what_if = _degree(par.tp, min(par.gpus, gpus_per_node), lambda d: m.heads % d == 0)
    b, s, h, k = tr.micro_batch, m.seq, m.hidden, tr.bytes_per_value
    exact = 4 * _sent("all_reduce", "ring", t, b * s * h, k)
    return Row("TP (Megatron-LM)", t, what_if, "per GPU, per layer per micro-batch",
               "8·b·s·h", seed_tp_bytes_per_layer(b, s, h, k), "4 x 2·(t-1)/t·b·s·h", exact)


def pp_row(m: ModelShape, tr: Training, par: Parallel) -> Row:
    """Activations forward and gradients backward across the p-1 stage boundaries."""
    p, what_if = _degree(par.pp, min(par.gpus, m.layers))
    b, s, h, k = tr.micro_batch, m.seq, m.hidden, tr.bytes_per_value
    split = par.tp      # scatter/gather (or SP's shard): 1/t per tp rank (Narayanan et al. 2021 §4.1)
    one = (b * s * h // split) * k
    scope = "whole pipeline, per micro-batch" + (f", one tp rank's 1/{split} slice" if split > 1 else "")
    return Row("PP", p, what_if, scope,
               "2·(p-1)·b·s·h", seed_pp_bytes(p, b, s, h, k),
               "2·(p-1)·b·s·h" + ("/t" if split > 1 else ""), 2 * (p - 1) * one)


def strategy_comparison(m: ModelShape, tr: Training, par: Parallel, gpus_per_node: int = 8) -> list[Row]:
    """Every strategy's textbook formula next to its exact bytes (see the module doc)."""
    return [*dp_rows(m, tr, par), tp_row(m, tr, par, gpus_per_node), pp_row(m, tr, par)]


STAGE_LABELS = ("DP (ZeRO-0)", "ZeRO-1", "ZeRO-2", "ZeRO-3")


def memory_by_stage(m: ModelShape, tr: Training, par: Parallel) -> list[tuple[str, Memory]]:
    """Memory per GPU with ZeRO stage 0..3 and every other setting of `par` (no offload at 0)."""
    out = []
    for stage, label in enumerate(STAGE_LABELS):
        offload = par.offload if stage else "none"
        out.append((label, memory(m, tr, dataclasses.replace(par, zero=stage, offload=offload))))
    return out
