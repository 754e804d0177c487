"""Which pieces of which global tensors a rank holds: its weights and optimizer states, as views.

A rank's optimizer owns, per flat bucket (`parallel.flat`), the range [lo, hi) of the bucket: the
whole bucket under plain data parallelism, its 1/dp shard under ZeRO. Parameter i of the bucket
sits at [offset_i, offset_i + numel_i), so the rank owns [max(lo, offset_i), min(hi, offset_i +
numel_i)) − offset_i of that parameter, flattened: of its tensor-parallel slice when tensor
parallelism splits it (`partition_dim`, `partition_stride`, Megatron's marks). Each such range is
one piece of "param/<name>", "exp_avg/<name>", "exp_avg_sq/<name>" and, in 16-bit training,
"master/<name>".

Writing, one copy of each element is enough: under plain data parallelism dp rank 0 writes, a
parameter tensor parallelism replicates is written by tp rank 0, and the last pipeline stage's
copy of a tied embedding is left to the first stage. Loading, every rank fills all it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringzero.parallel.tp.grads import TPParamKind, tp_param_kind
from ringzero.checkpoint.manifest import TPSlice

STATES = ("exp_avg", "exp_avg_sq")


@dataclass
class Local:
    """One piece this rank holds: `tensor` (1-D view into the rank's buffers) is elements `flat`
    of slice `tp` of global tensor `name`, whose shape is `shape`."""

    name: str
    tensor: torch.Tensor
    flat: tuple[int, int]
    tp: TPSlice | None
    shape: tuple[int, ...]


def _tp(p: torch.nn.Parameter, shape: tuple[int, ...], t: int, r: int) -> tuple[TPSlice | None, tuple[int, ...]]:
    """(this rank's slice of p, p's global shape); `shape`: p's own (ZeRO-3 may have released it)."""
    if tp_param_kind(p) is not TPParamKind.SHARDED or t == 1:
        return None, shape
    return TPSlice(p.partition_dim, p.partition_stride, r, t, shape), tuple(p.tp_full_shape)


def optimizer_states(opt) -> dict[str, list[torch.Tensor]]:
    """The optimizer's per-bucket fp32 tensors by state name: "master", "exp_avg", "exp_avg_sq" (an
    NVMe-offloaded optimizer reads them from its files into new host tensors)."""
    if hasattr(opt, "read_state"):
        master, m, v = opt.read_state()
    else:
        master, m, v = opt.master, opt.exp_avg, opt.exp_avg_sq
    return {"master": master, "exp_avg": m, "exp_avg_sq": v}


def pieces(strategy, topology, opt, writing: bool, states: dict | None = None) -> list[Local]:
    """This rank's pieces of the weights and (when `opt` is given) the optimizer states (`states`:
    `optimizer_states(opt)` already read); `writing`: only those this rank writes (see the module
    doc). "master/" only in 16-bit training: in fp32 the weights are the master."""
    names = {id(p): n for n, p in strategy.model.named_parameters()}
    sharded = strategy.sharding.shard_optimizer
    if writing and not sharded and topology.dp_rank != 0:
        return []
    if opt is not None:
        states = dict(states if states is not None else optimizer_states(opt))
        if not opt.mixed:
            states.pop("master")
    else:
        states = {}
    weights = strategy.owned_weights()
    out = []
    for k, g in enumerate(strategy.groups):
        b = g.bucket
        lo, hi = (b.lo, b.hi) if sharded else (0, b.numel)
        for i, p in enumerate(b.params):
            a, z = max(lo, b.offsets[i]), min(hi, b.offsets[i + 1])
            if a >= z:
                continue
            tp, shape = _tp(p, tuple(b.shapes[i]), topology.tp, topology.tp_rank)
            if writing and ((tp is None and topology.tp_rank != 0) or getattr(p, "pipeline_tied_copy", False)):
                continue
            flat, span = (a - b.offsets[i], z - b.offsets[i]), slice(a - lo, z - lo)
            name = names[id(p)]
            out.append(Local(f"param/{name}", weights[k][span], flat, tp, shape))
            for state, tensors in states.items():
                out.append(Local(f"{state}/{name}", tensors[k][span], flat, tp, shape))
    return out
