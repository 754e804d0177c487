"""Tensor-parallel parameters and gradients: how each parameter is held (`TPParamKind`), whole values
from the shards (`unshard`), and in a data-parallel strategy's flat buckets the sequence-parallel
sum and the global norm (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2.2).

Every tp rank holds a model of the same parameter shapes in the same order, so the strategy lays
them out in identical buckets and a dp rank owns the same range of each on every tp rank. Two facts
follow, used here instead of touching each parameter's .grad:

- with sequence parallelism, a LayerNorm or row-parallel bias gradient is a partial sum per tp rank;
  summing the owned ranges of those parameters over the tp group after the dp reduction gives the
  same result as summing before it (sums commute), with one all-reduce per step of only what this
  rank owns (Megatron all-reduces them once per step too);
- the global gradient norm counts a tp-sharded parameter once per shard and a replicated one once in
  all: each rank sums the squares of its shards, tp rank 0 also those of the replicated ranges, and
  the owners' sum runs over dp (when gradients are sharded) and tp.
"""

from __future__ import annotations

import enum

import torch

from ringzero import comm
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import SP


class TPParamKind(enum.Enum):
    SHARDED = "sharded"
    """Each tp rank holds a slice (`partition_dim`); its gradient is complete."""
    REPLICATED = "replicated"
    """The same value and the same, complete gradient on every tp rank."""
    PARTIAL_GRAD = "partial_grad"
    """The same value; each rank's gradient is a partial sum (sequence parallelism): all-reduce over tp."""


def tp_param_kind(p: torch.Tensor) -> TPParamKind:
    """How tensor parallelism holds `p` (REPLICATED for a parameter it never marked)."""
    return getattr(p, "tp_kind", TPParamKind.REPLICATED)


@tagged(SP)
def _sum_over_tp(pieces: list[torch.Tensor], topology, algorithm: str) -> None:
    """Sum tensors `pieces` in place over the tp group: one all-reduce per dtype of their
    concatenation (Megatron coalesces them likewise), in one order on every rank."""
    if topology.tp == 1 or not pieces:
        return
    for dtype in dict.fromkeys(p.dtype for p in pieces):
        same = [p for p in pieces if p.dtype == dtype]
        flat = torch.cat([p.reshape(-1) for p in same])
        comm.all_reduce(flat, op="sum", group=topology.tp_group, algorithm=algorithm)
        for p, v in zip(same, flat.split([p.numel() for p in same])):
            p.copy_(v.view_as(p))


def sync_sequence_parallel_grads(params, topology, algorithm: str = "auto") -> None:
    """Sum the .grad of PARTIAL_GRAD parameters over the tp group (a model outside a strategy)."""
    _sum_over_tp([p.grad for p in params if tp_param_kind(p) is TPParamKind.PARTIAL_GRAD and p.grad is not None],
                 topology, algorithm)


def unshard(tensor: torch.Tensor, param: torch.Tensor, topology, algorithm: str = "auto") -> torch.Tensor:
    """The whole tensor of which `tensor` (param's value or gradient) is this rank's slice: all-gathered
    over the tp group, its stacked blocks reassembled and the vocabulary padding dropped. A tensor of
    an unsharded parameter is returned as it is. Every tp rank must call it."""
    if tp_param_kind(param) is not TPParamKind.SHARDED or topology.tp == 1:
        return tensor
    t, dim, stride = topology.tp, param.partition_dim, param.partition_stride
    out = tensor.new_empty(t * tensor.numel())           # flat: gloo's own all-gather takes no (t, ...) stack
    comm.all_gather_into_tensor(out, tensor.reshape(-1), group=topology.tp_group, algorithm=algorithm)
    blocks = [piece.chunk(stride, dim) for piece in out.view((t,) + tuple(tensor.shape)).unbind(0)]
    full = torch.cat([blocks[r][j] for j in range(stride) for r in range(t)], dim)
    return full.narrow(dim, 0, param.tp_full_shape[dim])


def _owned(bucket, sharded: bool) -> tuple[int, int]:
    return (bucket.lo, bucket.hi) if sharded else (0, bucket.numel)


def _ranges(strategy, keep) -> list[list[slice]]:
    """Per bucket, the ranges of its owned tensor (shard or whole) whose parameters satisfy `keep`,
    in owned-tensor coordinates, adjacent ranges merged."""
    out = []
    for g in strategy.groups:
        b = g.bucket
        lo, hi = _owned(b, strategy.sharding.shard_optimizer)
        spans: list[list[int]] = []
        for i, p in enumerate(b.params):
            a, z = max(b.offsets[i], lo), min(b.offsets[i + 1], hi)
            if a < z and keep(p):
                if spans and spans[-1][1] == a - lo:
                    spans[-1][1] = z - lo
                else:
                    spans.append([a - lo, z - lo])
        out.append([slice(a, z) for a, z in spans])
    return out


class TensorParallelGrads:
    """The tp side of `strategy`'s reduced gradients on `topology` (see the module doc)."""

    def __init__(self, strategy, topology, algorithm: str = "auto") -> None:
        self.strategy, self.topology, self.algorithm = strategy, topology, algorithm
        self.partial = _ranges(strategy, lambda p: tp_param_kind(p) is TPParamKind.PARTIAL_GRAD)
        first = topology.tp_rank == 0
        # A pipeline's last stage holds a copy of the tied embedding: counted on the first stage only.
        self.counted = _ranges(strategy, lambda p: (first or tp_param_kind(p) is TPParamKind.SHARDED)
                               and not getattr(p, "pipeline_tied_copy", False))

    @property
    def partial_elements(self) -> int:
        """Elements `sync` sums per step (this rank's ranges of the sequence-parallel gradients)."""
        return sum(s.stop - s.start for ranges in self.partial for s in ranges)

    def sync(self, grads: list[torch.Tensor]) -> None:
        """Sum the sequence-parallel ranges of `grads` (one per bucket) over the tp group, in place."""
        _sum_over_tp([g[s] for g, ranges in zip(grads, self.partial) for s in ranges], self.topology,
                     self.algorithm)

    def sum_over_owners(self):
        """The strategy's sum over dp owners, then over the tp group and the pipeline stages."""
        dp_sum, topo = self.strategy.sum_over_owners(), self.topology
        groups = [g for g, n in ((topo.tp_group, topo.tp), (topo.pp_group, topo.pp)) if n > 1]
        if not groups:
            return dp_sum

        def reduce(t: torch.Tensor) -> None:
            if dp_sum is not None:
                dp_sum(t)
            for g in groups:
                comm.all_reduce(t, op="sum", group=g, algorithm=self.algorithm)
        return reduce
