"""The public collectives that cut or assemble buffers: reduce-scatter, gather, scatter, all-to-all.

Same conventions as `api.py`: validate, optional handshake, flat work buffers with chunk `bounds`,
algorithm over `TorchComm`, results copied into the caller's tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..plan.chunks import bounds_from_sizes
from . import backend, registry
from .api import SUM, _avg, _comm, _flat, _prepare, _torch_call
from .ops import Op, parse_op, torch_op


def _cat(tensors, dtype, device) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=dtype, device=device)
    return torch.cat([t.reshape(-1) for t in tensors])


def reduce_scatter_tensor(output, input, op=SUM, group=None, algorithm="auto"):
    op = parse_op(op)
    prep = _prepare("reduce_scatter", algorithm, group, input.dtype, op, input.numel())
    if prep is None:
        return
    n, rank, algorithm = prep
    if input.numel() != n * output.numel() or output.dtype != input.dtype:
        raise ValueError(f"reduce_scatter_tensor: input must have {n} x {output.numel()} elements of "
                         f"{output.dtype}, got {input.numel()} of {input.dtype}")
    if input.numel() == 0:
        return
    if algorithm == "torch":
        _torch_call("reduce_scatter", backend.reduce_scatter_single, output, input, op=torch_op(op), group=group)
    else:
        work = input.reshape(-1).clone()  # the algorithm reduces in place; the input stays intact
        bounds = bounds_from_sizes([output.numel()] * n)
        registry.resolve("reduce_scatter", algorithm)(_comm("reduce_scatter", algorithm, group, work, op),
                                                     work, bounds)
        output.copy_(work[bounds[rank]:bounds[rank + 1]].view(output.shape))
    _avg(output, op, n)


def reduce_scatter(output, input_list, op=SUM, group=None, algorithm="auto"):
    op = parse_op(op)
    sizes = [t.numel() for t in input_list]
    prep = _prepare("reduce_scatter", algorithm, group, output.dtype, op, sum(sizes))
    if prep is None:
        return
    n, rank, algorithm = prep
    if len(input_list) != n or sizes[rank] != output.numel():
        raise ValueError(f"reduce_scatter: input_list needs {n} tensors and entry {rank} the output's "
                         f"{output.numel()} elements; got {len(input_list)} tensors of sizes {sizes}")
    if sum(sizes) == 0:
        return
    if algorithm == "torch":
        if len(set(sizes)) > 1:
            raise ValueError(f"reduce_scatter: algorithm 'torch' needs equal tensor sizes, got {sizes}; "
                             f"ring, recursive_halving and naive accept uneven ones")
        _torch_call("reduce_scatter", dist.reduce_scatter, output, input_list, op=torch_op(op), group=group)
    else:
        work = _cat(input_list, output.dtype, output.device)
        bounds = bounds_from_sizes(sizes)
        registry.resolve("reduce_scatter", algorithm)(_comm("reduce_scatter", algorithm, group, work, op),
                                                     work, bounds)
        output.copy_(work[bounds[rank]:bounds[rank + 1]].view(output.shape))
    _avg(output, op, n)


def gather(tensor, gather_list=None, dst=0, group=None, algorithm="auto"):
    prep = _prepare("gather", algorithm, group, tensor.dtype, None, tensor.numel(), dst,
                    choice_count=lambda n: n * tensor.numel())
    if prep is None:
        return
    n, rank, algorithm = prep
    if rank == dst and (gather_list is None or len(gather_list) != n
                        or any(t.numel() != tensor.numel() for t in gather_list)):
        raise ValueError(f"gather: rank {dst} (dst) needs gather_list of {n} tensors with "
                         f"{tensor.numel()} elements each")
    if rank != dst and gather_list:
        raise ValueError(f"gather: gather_list must be None on rank {rank}, which is not dst {dst}")
    if tensor.numel() == 0:
        return
    if algorithm == "torch":
        gdst = dist.get_global_rank(group, dst) if group is not None else dst
        return _torch_call("gather", dist.gather, tensor, gather_list, dst=gdst, group=group)
    bounds = bounds_from_sizes([tensor.numel()] * n)
    work = torch.empty(bounds[-1], dtype=tensor.dtype, device=tensor.device)
    work[bounds[rank]:bounds[rank + 1]].copy_(tensor.reshape(-1))
    registry.resolve("gather", algorithm)(_comm("gather", algorithm, group, work, Op.SUM), work, bounds, dst)
    if rank == dst:
        for i, t in enumerate(gather_list):
            t.copy_(work[bounds[i]:bounds[i + 1]].view(t.shape))


def scatter(tensor, scatter_list=None, src=0, group=None, algorithm="auto"):
    prep = _prepare("scatter", algorithm, group, tensor.dtype, None, tensor.numel(), src,
                    choice_count=lambda n: n * tensor.numel())
    if prep is None:
        return
    n, rank, algorithm = prep
    if rank == src and (scatter_list is None or len(scatter_list) != n
                        or any(t.numel() != tensor.numel() or t.dtype != tensor.dtype for t in scatter_list)):
        raise ValueError(f"scatter: rank {src} (src) needs scatter_list of {n} tensors of {tensor.dtype} "
                         f"with {tensor.numel()} elements each")
    if rank != src and scatter_list:
        raise ValueError(f"scatter: scatter_list must be None on rank {rank}, which is not src {src}")
    if tensor.numel() == 0:
        return
    if algorithm == "torch":
        gsrc = dist.get_global_rank(group, src) if group is not None else src
        return _torch_call("scatter", dist.scatter, tensor, scatter_list, src=gsrc, group=group)
    bounds = bounds_from_sizes([tensor.numel()] * n)
    if rank == src:
        work = _cat(scatter_list, tensor.dtype, tensor.device)
    else:
        work = torch.empty(bounds[-1], dtype=tensor.dtype, device=tensor.device)
    registry.resolve("scatter", algorithm)(_comm("scatter", algorithm, group, work, Op.SUM), work, bounds, src)
    tensor.copy_(work[bounds[rank]:bounds[rank + 1]].view(tensor.shape))


def all_to_all(output_tensor_list, input_tensor_list, group=None, algorithm="auto"):
    send_sizes = [t.numel() for t in input_tensor_list]
    recv_sizes = [t.numel() for t in output_tensor_list]
    ref = input_tensor_list[0] if input_tensor_list else None
    if ref is None or len(input_tensor_list) != len(output_tensor_list):
        raise ValueError("all_to_all: input and output lists must be non-empty and of the same length")

    def sizes_agree(rows):  # rank i's send to j must be rank j's receive from i
        m = len(rows)
        for i in range(m):
            for j in range(m):
                if rows[i][j] != rows[j][m + i]:
                    return (f"rank {i} sends {rows[i][j]} elements to rank {j}, "
                            f"which expects {rows[j][m + i]}")
        return None

    # "auto" must choose the same algorithm on every rank, and an uneven all-to-all gives each
    # rank a different local size; so it prices the rank-independent count 0 (latency only).
    prep = _prepare("all_to_all", algorithm, group, ref.dtype, None, 0,
                    extra=send_sizes + recv_sizes, extra_check=sizes_agree)
    if prep is None:
        return
    n, rank, algorithm = prep
    if len(input_tensor_list) != n:
        raise ValueError(f"all_to_all: lists need {n} tensors (the group size), got {len(input_tensor_list)}")
    if algorithm == "torch":
        if len(set(send_sizes + recv_sizes)) > 1:
            raise ValueError(f"all_to_all: algorithm 'torch' needs equal tensor sizes, got {send_sizes}; "
                             f"pairwise and naive accept uneven ones")
        return _torch_call("all_to_all", dist.all_to_all, output_tensor_list, input_tensor_list, group=group)
    sbuf = _cat(input_tensor_list, ref.dtype, ref.device)
    rbuf = torch.empty(sum(recv_sizes), dtype=ref.dtype, device=ref.device)
    rbounds = bounds_from_sizes(recv_sizes)
    registry.resolve("all_to_all", algorithm)(_comm("all_to_all", algorithm, group, sbuf, Op.SUM),
                                             sbuf, bounds_from_sizes(send_sizes), rbuf, rbounds)
    for i, t in enumerate(output_tensor_list):
        t.copy_(rbuf[rbounds[i]:rbounds[i + 1]].view(t.shape))
