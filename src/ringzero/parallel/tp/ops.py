"""The differentiable collectives of tensor and sequence parallelism, on `ringzero.comm`.

Each operator is an autograd Function whose backward is its forward's conjugate:

- `copy_to_tp` is Megatron's f (Shoeybi et al. 2019 §3, Fig. 3): identity forward, all-reduce of the
  input's gradient backward. It stands before a column-parallel region, whose ranks each take a
  partial gradient of the replicated input.
- `reduce_from_tp` is its g: all-reduce forward (the partial sums of a row-parallel layer), identity
  backward.
- Sequence parallelism (Korthikanti et al. 2022 §4.2.2) replaces f and g by an all-gather along the
  sequence (`gather_from_seq`, backward: reduce-scatter) and a reduce-scatter along the sequence
  (`reduce_scatter_to_seq`, backward: all-gather), the paper's g and ḡ: the same bytes as one
  all-reduce, in two halves, with the activations between regions held as (b, s/t, h).
- `scatter_to_seq` keeps this rank's slice of the sequence (no communication; backward: all-gather);
  it hands the replicated embedding output to the first sequence-parallel region.

Every collective goes through `ringzero.comm` (so the traffic meter counts it and `algorithm=`
applies, a name valid for all_reduce, all_gather and reduce_scatter: "auto", "torch", "ring", ...).
`group` follows `ringzero.comm`: None is the default group. On a group of one rank every operator is
the identity (or a copy) and sends nothing. The sequence dimension is `dim` (1 for ringzero's (b, s, h)
activations); shard r holds positions [r·s/t, (r+1)·s/t).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm.kinds import tagged
from ringzero.plan.comm.kinds import TP


def group_size(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _identity(x: torch.Tensor, dim: int, group, algorithm: str) -> torch.Tensor:
    return x.view_as(x)


@tagged(TP)
def _all_reduce(x: torch.Tensor, dim: int, group, algorithm: str) -> torch.Tensor:
    out = x.contiguous().clone()             # comm reduces in place; autograd's tensors stay intact
    comm.all_reduce(out, op="sum", group=group, algorithm=algorithm)
    return out


def _check_seq(x: torch.Tensor, dim: int, t: int) -> None:
    if x.size(dim) % t:
        raise ValueError(f"sequence parallelism needs the sequence ({x.size(dim)}) divisible by tp={t}")


@tagged(TP)
def _all_gather_seq(x: torch.Tensor, dim: int, group, algorithm: str) -> torch.Tensor:
    """(b, s/t, h) per rank -> (b, s, h), the shards in rank order along `dim`."""
    t = group_size(group)
    local = x.movedim(dim, 0).contiguous()                             # (s/t, b, h)
    out = local.new_empty((t * local.size(0),) + local.shape[1:])      # (s, b, h): t shards back to back
    comm.all_gather_into_tensor(out, local, group=group, algorithm=algorithm)
    return out.movedim(0, dim).contiguous()


@tagged(TP)
def _reduce_scatter_seq(x: torch.Tensor, dim: int, group, algorithm: str) -> torch.Tensor:
    """(b, s, h) partial sums per rank -> this rank's (b, s/t, h) of their sum."""
    t = group_size(group)
    _check_seq(x, dim, t)
    full = x.movedim(dim, 0).contiguous()                              # (s, b, h): shard r is rows r·s/t..
    out = full.new_empty((full.size(0) // t,) + full.shape[1:])        # (s/t, b, h)
    comm.reduce_scatter_tensor(out, full, op="sum", group=group, algorithm=algorithm)
    return out.movedim(0, dim).contiguous()


def _seq_shard(x: torch.Tensor, dim: int, group, algorithm: str) -> torch.Tensor:
    t = group_size(group)
    _check_seq(x, dim, t)
    return x.chunk(t, dim=dim)[dist.get_rank(group)].contiguous()


def _conjugate(name: str, forward, backward, doc: str) -> type[torch.autograd.Function]:
    """An autograd Function running `forward(x, dim, group, algorithm)` and, on the gradient, `backward`."""

    def fwd(ctx, x, dim, group, algorithm):
        ctx.args = (dim, group, algorithm)
        return forward(x, dim, group, algorithm)

    def bwd(ctx, grad):
        return backward(grad, *ctx.args), None, None, None

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd),
                                                    "__doc__": doc})


_CopyToTP = _conjugate("_CopyToTP", _identity, _all_reduce, "f: identity forward, all-reduce backward.")
_ReduceFromTP = _conjugate("_ReduceFromTP", _all_reduce, _identity, "g: all-reduce forward, identity backward.")
_GatherFromSeq = _conjugate("_GatherFromSeq", _all_gather_seq, _reduce_scatter_seq,
                            "All-gather along the sequence forward, reduce-scatter backward.")
_ReduceScatterToSeq = _conjugate("_ReduceScatterToSeq", _reduce_scatter_seq, _all_gather_seq,
                                 "Reduce-scatter along the sequence forward, all-gather backward.")
_ScatterToSeq = _conjugate("_ScatterToSeq", _seq_shard, _all_gather_seq,
                           "This rank's sequence shard forward, all-gather backward.")


def copy_to_tp(x: torch.Tensor, group=None, algorithm: str = "auto") -> torch.Tensor:
    """f: x unchanged; in backward the gradient is all-reduced over `group`."""
    return x if group_size(group) == 1 else _CopyToTP.apply(x, 1, group, algorithm)


def reduce_from_tp(x: torch.Tensor, group=None, algorithm: str = "auto") -> torch.Tensor:
    """g: the sum of x over `group`; the gradient passes through unchanged."""
    return x if group_size(group) == 1 else _ReduceFromTP.apply(x, 1, group, algorithm)


def gather_from_seq(x: torch.Tensor, group=None, algorithm: str = "auto", dim: int = 1) -> torch.Tensor:
    """(b, s/t, h) -> (b, s, h) by all-gather; in backward the gradient is reduce-scattered."""
    return x if group_size(group) == 1 else _GatherFromSeq.apply(x, dim, group, algorithm)


def reduce_scatter_to_seq(x: torch.Tensor, group=None, algorithm: str = "auto", dim: int = 1) -> torch.Tensor:
    """(b, s, h) partial sums -> this rank's (b, s/t, h) of the sum; backward all-gathers."""
    return x if group_size(group) == 1 else _ReduceScatterToSeq.apply(x, dim, group, algorithm)


def scatter_to_seq(x: torch.Tensor, group=None, algorithm: str = "auto", dim: int = 1) -> torch.Tensor:
    """(b, s, h) replicated -> this rank's (b, s/t, h); backward all-gathers (`algorithm`)."""
    return x if group_size(group) == 1 else _ScatterToSeq.apply(x, dim, group, algorithm)
