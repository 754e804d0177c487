"""The public collectives: `torch.distributed` signatures plus `algorithm=`.

Each function validates its arguments (one clear error naming the problem), optionally runs the
metadata handshake (`check.verify`), turns its tensors into flat 1-D work buffers, runs the chosen
algorithm over `TorchComm`, and copies results back where the caller's tensors are not the buffers
themselves (non-contiguous tensors, lists). `algorithm="torch"` calls the backend's collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..plan.chunks import bounds_from_sizes, chunk_bounds
from . import backend, check, registry, select
from .config import get_config
from .meter import active_entries
from .ops import Op, check_dtype, parse_op, torch_op
from .p2p import TorchComm

SUM = Op.SUM


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D view of `t` (a copy when `t` is not contiguous; callers copy back)."""
    return (t if t.is_contiguous() else t.contiguous()).view(-1)


def _copy_back(t: torch.Tensor, flat: torch.Tensor) -> None:
    if flat.data_ptr() != t.data_ptr() or not t.is_contiguous():
        t.copy_(flat.view(t.shape))


def _prepare(collective, algorithm, group, dtype, op, count, root=-1, extra=None, extra_check=None,
             choice_count=None):
    """Validate and return (group size, rank, resolved algorithm), or None if not in the group.

    `count` is what every rank must agree on; `choice_count` (default `count`) the whole buffer
    `select.choose` prices, in the convention of `plan.comm_volume.call_for`. A callable gets the
    group size.
    """
    registry.check_name(collective, algorithm)
    check_dtype(dtype, op, collective)
    if group is None:
        group = dist.group.WORLD
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if root != -1 and not 0 <= root < n:
        raise ValueError(f"{collective}: root {root} is not a rank of this group (size {n})")
    if get_config().checks and n > 1:
        sig = check.signature(collective, algorithm, op, dtype, count, root)
        check.verify(group, collective, sig, extra, extra_check)
    if algorithm == "auto":
        itemsize = torch.empty((), dtype=dtype).element_size()
        whole = count if choice_count is None else choice_count
        whole = whole(n) if callable(whole) else whole
        algorithm = select.choose(collective, n, whole * itemsize, get_config().node_size(n))
    return n, rank, algorithm


def _comm(collective, algorithm, group, ref: torch.Tensor, op: Op) -> TorchComm:
    cfg = get_config()
    c = TorchComm(group, ref.dtype, ref.device, op, f"{collective}/{algorithm}")
    c.ranks_per_node = cfg.node_size(c.size)
    return c


def _torch_call(collective: str, fn, *args, **kwargs):
    for rec in active_entries(f"{collective}/torch"):
        rec.calls += 1
    fn(*args, **kwargs)


def _avg(t: torch.Tensor, op: Op, n: int) -> None:
    if op is Op.AVG:
        t.div_(n)


def all_reduce(tensor, op=SUM, group=None, algorithm="auto"):
    op = parse_op(op)
    prep = _prepare("all_reduce", algorithm, group, tensor.dtype, op, tensor.numel())
    if prep is None or tensor.numel() == 0:
        return
    n, _, algorithm = prep
    flat = _flat(tensor)
    if algorithm == "torch":
        _torch_call("all_reduce", dist.all_reduce, flat, op=torch_op(op), group=group)
    else:
        registry.resolve("all_reduce", algorithm)(_comm("all_reduce", algorithm, group, flat, op),
                                                 flat, chunk_bounds(flat.numel(), n))
    _copy_back(tensor, flat)
    _avg(tensor, op, n)


def reduce(tensor, dst, op=SUM, group=None, algorithm="auto"):
    op = parse_op(op)
    prep = _prepare("reduce", algorithm, group, tensor.dtype, op, tensor.numel(), dst)
    if prep is None or tensor.numel() == 0:
        return
    n, rank, algorithm = prep
    # Non-root ranks work on a copy: algorithms accumulate into their buffer, and a caller's input
    # on a non-root rank is left as it was.
    flat = _flat(tensor) if rank == dst else tensor.reshape(-1).clone()
    if algorithm == "torch":
        gdst = dist.get_global_rank(group, dst) if group is not None else dst
        _torch_call("reduce", dist.reduce, flat, gdst, op=torch_op(op), group=group)
    else:
        registry.resolve("reduce", algorithm)(_comm("reduce", algorithm, group, flat, op),
                                             flat, chunk_bounds(flat.numel(), n), dst)
    if rank == dst:
        _copy_back(tensor, flat)
    if rank == dst:
        _avg(tensor, op, n)


def broadcast(tensor, src, group=None, algorithm="auto"):
    prep = _prepare("broadcast", algorithm, group, tensor.dtype, None, tensor.numel(), src)
    if prep is None or tensor.numel() == 0:
        return
    n, _, algorithm = prep
    flat = _flat(tensor)
    if algorithm == "torch":
        gsrc = dist.get_global_rank(group, src) if group is not None else src
        _torch_call("broadcast", dist.broadcast, flat, gsrc, group=group)
    else:
        registry.resolve("broadcast", algorithm)(_comm("broadcast", algorithm, group, flat, Op.SUM),
                                                flat, chunk_bounds(flat.numel(), n), src)
    _copy_back(tensor, flat)


def _gather_like(collective, algorithm, group, out_flat, bounds, *root):
    registry.resolve(collective, algorithm)(_comm(collective, algorithm, group, out_flat, Op.SUM),
                                           out_flat, bounds, *root)


def all_gather_into_tensor(output, input, group=None, algorithm="auto"):
    prep = _prepare("all_gather", algorithm, group, input.dtype, None, output.numel())
    if prep is None:
        return
    n, rank, algorithm = prep
    if output.numel() != n * input.numel() or output.dtype != input.dtype:
        raise ValueError(f"all_gather_into_tensor: output must have {n} x {input.numel()} elements of "
                         f"{input.dtype}, got {output.numel()} of {output.dtype}")
    if output.numel() == 0:
        return
    if algorithm == "torch":
        return _torch_call("all_gather", backend.all_gather_single, output, input, group=group)
    flat = _flat(output)
    bounds = chunk_bounds(flat.numel(), n)
    flat[bounds[rank]:bounds[rank + 1]].copy_(input.reshape(-1))
    _gather_like("all_gather", algorithm, group, flat, bounds)
    _copy_back(output, flat)


def all_gather(tensor_list, tensor, group=None, algorithm="auto"):
    sizes = [t.numel() for t in tensor_list]
    prep = _prepare("all_gather", algorithm, group, tensor.dtype, None, sum(sizes))
    if prep is None:
        return
    n, rank, algorithm = prep
    if len(tensor_list) != n or sizes[rank] != tensor.numel():
        raise ValueError(f"all_gather: tensor_list needs {n} tensors and entry {rank} the input's "
                         f"{tensor.numel()} elements; got {len(tensor_list)} tensors of sizes {sizes}")
    if algorithm == "torch":
        if len(set(sizes)) > 1:
            raise ValueError(f"all_gather: algorithm 'torch' needs equal tensor sizes, got {sizes}; "
                             f"ring, recursive_doubling and naive accept uneven ones")
        return _torch_call("all_gather", dist.all_gather, tensor_list, tensor, group=group)
    bounds = bounds_from_sizes(sizes)
    flat = torch.empty(bounds[-1], dtype=tensor.dtype, device=tensor.device)
    flat[bounds[rank]:bounds[rank + 1]].copy_(tensor.reshape(-1))
    if bounds[-1]:
        _gather_like("all_gather", algorithm, group, flat, bounds)
    for i, t in enumerate(tensor_list):
        t.copy_(flat[bounds[i]:bounds[i + 1]].view(t.shape))
