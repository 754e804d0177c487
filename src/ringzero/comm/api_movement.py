"""The public collectives that cut or assemble buffers: reduce-scatter, gather, scatter, all-to-all.

Same conventions as `api.py`: validate, optional handshake, flat work buffers with chunk `bounds`,
algorithm over `TorchComm`, results copied into the caller's tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero.plan.comm.chunks import bounds_from_sizes
from ringzero.comm import backend, registry
from ringzero.comm.api import SUM, _avg, _comm, _list_sizes, _prepare, _torch_call, _torch_needs_equal, work
from ringzero.comm.flight import recorded
from ringzero.comm.ops import Op, parse_op, torch_op


@recorded("reduce_scatter_tensor")
@torch.no_grad()
def reduce_scatter_tensor(output, input, op=SUM, group=None, algorithm="auto"):
    def describe(n, rank):
        if input.numel() != n * output.numel() or output.dtype != input.dtype:
            raise ValueError(f"reduce_scatter_tensor: input must have {n} x {output.numel()} elements "
                             f"of {output.dtype}, got {input.numel()} of {input.dtype}")
        return dict(dtype=input.dtype, count=input.numel(), op=parse_op(op))

    prep = _prepare("reduce_scatter", algorithm, group, describe, (output, input))
    if prep is None or input.numel() == 0:
        return
    n, rank, call, algorithm = prep
    if algorithm == "torch":
        _torch_call("reduce_scatter", backend.reduce_scatter_single, output, input, op=torch_op(call.op),
                    group=group)
    else:
        c = _comm("reduce_scatter", algorithm, group, input, call.op)
        buf = work(c, [input])  # the algorithm reduces in place; the input stays intact
        _reduce_scatter(algorithm, c, buf, bounds_from_sizes([output.numel()] * n), rank, output)
    _avg(output, call.op, n)


@recorded("reduce_scatter")
@torch.no_grad()
def reduce_scatter(output, input_list, op=SUM, group=None, algorithm="auto"):
    def describe(n, rank):
        sizes = _list_sizes("reduce_scatter", "input_list", input_list, n, rank, output.numel(), "output")
        _torch_needs_equal("reduce_scatter", algorithm, sizes, "ring, recursive_halving and naive")
        return dict(dtype=output.dtype, count=sum(sizes), op=parse_op(op), sizes=sizes)

    prep = _prepare("reduce_scatter", algorithm, group, describe, (output, input_list))
    if prep is None or not sum(prep[2].sizes):
        return
    n, rank, call, algorithm = prep
    if algorithm == "torch":
        _torch_call("reduce_scatter", dist.reduce_scatter, output, input_list, op=torch_op(call.op),
                    group=group)
    else:
        c = _comm("reduce_scatter", algorithm, group, output, call.op)
        _reduce_scatter(algorithm, c, work(c, input_list), bounds_from_sizes(call.sizes), rank, output)
    _avg(output, call.op, n)


def _reduce_scatter(algorithm, c, buf, bounds, rank, output) -> None:
    """Run the algorithm on the whole `buf` and copy this rank's reduced chunk to `output`."""
    registry.resolve("reduce_scatter", algorithm)(c, buf, bounds)
    output.copy_(buf[bounds[rank]:bounds[rank + 1]].view(output.shape))


def _rooted(collective, role, tensor, lst, root, n, rank):
    """The fields of gather/scatter; `lst` (gather_list / scatter_list) is needed on the root only."""
    if rank == root and (lst is None or len(lst) != n or any(
            t.numel() != tensor.numel() or t.dtype != tensor.dtype for t in lst)):
        raise ValueError(f"{collective}: rank {root} ({'dst' if collective == 'gather' else 'src'}) needs "
                         f"{role} of {n} tensors of {tensor.dtype} with {tensor.numel()} elements each")
    if rank != root and lst:
        raise ValueError(f"{collective}: {role} must be None on rank {rank}, which is not "
                         f"{'dst' if collective == 'gather' else 'src'} {root}")
    return dict(dtype=tensor.dtype, count=tensor.numel(), root=root, priced=n * tensor.numel())


def _rooted_call(collective, role, tensor, lst, root, group, algorithm, torch_fn, root_kw):
    """What gather and scatter share: the checks, and the backend's own call for "torch". Returns
    (n, rank, algorithm) when one of ringzero's algorithms is to run, None when nothing is left."""
    prep = _prepare(collective, algorithm, group,
                    lambda n, rank: _rooted(collective, role, tensor, lst, root, n, rank), (tensor, lst))
    if prep is None or tensor.numel() == 0:
        return None
    n, rank, _, algorithm = prep
    if algorithm == "torch":
        groot = dist.get_global_rank(group, root) if group is not None else root
        _torch_call(collective, torch_fn, tensor, lst, **{root_kw: groot}, group=group)
        return None
    return n, rank, algorithm


@recorded("gather")
@torch.no_grad()
def gather(tensor, gather_list=None, dst=0, group=None, algorithm="auto"):
    prep = _rooted_call("gather", "gather_list", tensor, gather_list, dst, group, algorithm, dist.gather, "dst")
    if prep is None:
        return
    n, rank, algorithm = prep
    bounds = bounds_from_sizes([tensor.numel()] * n)
    c = _comm("gather", algorithm, group, tensor, Op.SUM)
    buf = work(c, extra=bounds[-1])
    buf[bounds[rank]:bounds[rank + 1]].copy_(tensor.reshape(-1))
    registry.resolve("gather", algorithm)(c, buf, bounds, dst)
    if rank == dst:
        for i, t in enumerate(gather_list):
            t.copy_(buf[bounds[i]:bounds[i + 1]].view(t.shape))


@recorded("scatter")
@torch.no_grad()
def scatter(tensor, scatter_list=None, src=0, group=None, algorithm="auto"):
    prep = _rooted_call("scatter", "scatter_list", tensor, scatter_list, src, group, algorithm, dist.scatter, "src")
    if prep is None:
        return
    n, rank, algorithm = prep
    bounds = bounds_from_sizes([tensor.numel()] * n)
    c = _comm("scatter", algorithm, group, tensor, Op.SUM)
    buf = work(c, scatter_list) if rank == src else work(c, extra=bounds[-1])
    registry.resolve("scatter", algorithm)(c, buf, bounds, src)
    tensor.copy_(buf[bounds[rank]:bounds[rank + 1]].view(tensor.shape))


@recorded("all_to_all")
@torch.no_grad()
def all_to_all(output_tensor_list, input_tensor_list, group=None, algorithm="auto"):
    def describe(n, rank):
        if not input_tensor_list or len(input_tensor_list) != len(output_tensor_list):
            raise ValueError("all_to_all: input and output lists must be non-empty and of the same length")
        if len(input_tensor_list) != n:
            raise ValueError(f"all_to_all: lists need {n} tensors (the group size), "
                             f"got {len(input_tensor_list)}")
        send = tuple(t.numel() for t in input_tensor_list)
        recv = tuple(t.numel() for t in output_tensor_list)
        _torch_needs_equal("all_to_all", algorithm, send + recv, "pairwise and naive")
        # "auto" must choose the same algorithm on every rank, and an uneven all-to-all gives each
        # rank a different local size; so it prices the rank-independent count 0 (latency only).
        return dict(dtype=input_tensor_list[0].dtype, count=0, send=send, recv=recv, priced=0)

    prep = _prepare("all_to_all", algorithm, group, describe, (output_tensor_list, input_tensor_list))
    if prep is None:
        return
    _, _, call, algorithm = prep
    if algorithm == "torch":
        return _torch_call("all_to_all", dist.all_to_all, output_tensor_list, input_tensor_list, group=group)
    c = _comm("all_to_all", algorithm, group, input_tensor_list[0], Op.SUM)
    both = work(c, input_tensor_list, extra=sum(call.recv))
    sbuf, rbuf = both[:sum(call.send)], both[sum(call.send):]
    rbounds = bounds_from_sizes(call.recv)
    registry.resolve("all_to_all", algorithm)(c, sbuf, bounds_from_sizes(call.send), rbuf, rbounds)
    for i, t in enumerate(output_tensor_list):
        t.copy_(rbuf[rbounds[i]:rbounds[i + 1]].view(t.shape))
