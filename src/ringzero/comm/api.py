"""The public collectives: `torch.distributed` signatures plus `algorithm=`.

Each function validates its arguments (one clear error naming the problem; a tensor on the `meta`
device, which has a shape but no data, is refused rather than "reduced" to nothing), optionally runs the
metadata handshake (`check.verify`), turns its tensors into flat 1-D work buffers, runs the chosen
algorithm over `TorchComm`, and copies results back where the caller's tensors are not the buffers
themselves (non-contiguous tensors, lists). `algorithm="torch"` calls the backend's collective.
As in torch.distributed, a collective works on the tensors' data outside autograd (`torch.no_grad`):
a leaf that requires grad (a parameter) is reduced in place like any other tensor, and the results
record no graph.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero.plan.comm.algorithms import NODE_AWARE
from ringzero.plan.comm.chunks import bounds_from_sizes, chunk_bounds
from ringzero.comm import backend, check, registry, select, transport
from ringzero.comm.config import get_config
from ringzero.comm.flight import note_algorithm, recorded
from ringzero.comm.meter import active_entries, add
from ringzero.comm.ops import Op, check_dtype, parse_op, torch_op
from ringzero.comm.p2p import TorchComm

SUM = Op.SUM


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D view of `t` (a copy when `t` is not contiguous; callers copy back)."""
    return (t if t.is_contiguous() else t.contiguous()).view(-1)


def _copy_back(t: torch.Tensor, flat: torch.Tensor) -> None:
    if flat.data_ptr() != t.data_ptr() or not t.is_contiguous():
        t.copy_(flat.view(t.shape))


def _prepare(collective, algorithm, group, describe, tensors=()):
    """Validate the call, run the handshake when checks are on, and choose the algorithm.

    `describe(n, rank)` reads the arguments, raises ValueError/TypeError on a bad combination, and
    returns the `check.Call` fields that are not common to every collective (dtype, count, op, ...;
    `priced` is the whole buffer `select.choose` prices, in the convention of
    `plan.comm.volume.call_for`); `tensors` (tensors and lists of them, None allowed) are the
    call's, checked for data. Returns (group size, rank, call, algorithm to run), or None if
    this rank is not in the group. With checks on, a rank whose arguments fail still joins the
    handshake, so every rank raises its error instead of waiting for it.
    """
    if group is None:
        group = dist.group.WORLD
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    cfg = get_config()
    if not cfg.checks or n == 1:
        call = _call(collective, algorithm, n, rank, describe, tensors)
        note_algorithm(chosen := _choose(call, n, group))
        return n, rank, call, chosen
    seq = check.next_call(group)  # before the arguments are read: a call left on an exception counts
    call = chosen = error = None
    try:
        call = _call(collective, algorithm, n, rank, describe, tensors)
        chosen = _choose(call, n, group)
    except (ValueError, TypeError) as exc:
        error = exc
    node = cfg.node_size(n) if chosen in NODE_AWARE else 0
    check.verify(group, seq, call, chosen, node, collective, algorithm, error)
    note_algorithm(chosen)
    return n, rank, call, chosen


def _call(collective, algorithm, n, rank, describe, tensors=()) -> check.Call:
    """`describe`'s fields, and the checks every collective shares (name, tensors with data, dtype
    and op, root)."""
    registry.check_name(collective, algorithm)
    _check_devices(collective, tensors)
    fields = describe(n, rank)
    check_dtype(fields["dtype"], fields.get("op"), collective)
    root = fields.get("root")
    if root is not None and not 0 <= root < n:
        raise ValueError(f"{collective}: root {root} is not a rank of this group (size {n})")
    return check.Call(collective=collective, algorithm=algorithm, **fields)


def _check_devices(collective, tensors) -> None:
    """A meta tensor has a shape and no storage: torch.distributed returns at once without moving
    anything, which hides the mistake; refuse it, naming the device."""
    for t in tensors:
        for x in t if isinstance(t, (list, tuple)) else (t,):
            if isinstance(x, torch.Tensor) and x.device.type == "meta":
                raise ValueError(f"{collective}: a tensor is on device 'meta', which holds no data to "
                                 f"communicate; allowed: a tensor with data (cpu, or cuda under NCCL)")


def _choose(call: check.Call, n: int, group) -> str:
    if call.algorithm != "auto":
        return call.algorithm
    whole = call.count if call.priced is None else call.priced
    return select.choose(call.collective, n, whole * call.dtype.itemsize, get_config().node_size(n),
                         transport.in_use(group))


def _comm(collective, algorithm, group, ref: torch.Tensor, op: Op) -> TorchComm:
    cfg = get_config()
    c = TorchComm(group, ref.dtype, ref.device, op, f"{collective}/{algorithm}")
    c.ranks_per_node = cfg.node_size(c.size)
    return c


def work(c: TorchComm, tensors=(), extra: int = 0) -> torch.Tensor:
    """A call's flat work buffer from `c`'s scratch arena (`TorchComm.empty`): `tensors` one after
    another, then `extra` elements left as they are, in one request. A fresh buffer per call would
    fault its pages in on every call, and repeated large aligned allocations fragment glibc's heap
    under `ringzero.allocator`'s thresholds (up to 8 copies held, in `ringzero bench comm`)."""
    buf = c.empty(sum(t.numel() for t in tensors) + extra)
    at = 0
    for t in tensors:
        buf[at:at + t.numel()].copy_(t.reshape(-1))
        at += t.numel()
    return buf


def _torch_call(collective: str, fn, *args, **kwargs):
    add(active_entries(f"{collective}/torch"), calls=1)
    fn(*args, **kwargs)


def _avg(t: torch.Tensor, op: Op, n: int) -> None:
    if op is Op.AVG:
        t.div_(n)


@recorded("all_reduce")
@torch.no_grad()
def all_reduce(tensor, op=SUM, group=None, algorithm="auto"):
    prep = _prepare("all_reduce", algorithm, group, lambda n, rank: dict(
        dtype=tensor.dtype, count=tensor.numel(), op=parse_op(op)), (tensor,))
    if prep is None or tensor.numel() == 0:
        return
    n, _, call, algorithm = prep
    flat = _flat(tensor)
    if algorithm == "torch":
        _torch_call("all_reduce", dist.all_reduce, flat, op=torch_op(call.op), group=group)
    else:
        registry.resolve("all_reduce", algorithm)(_comm("all_reduce", algorithm, group, flat, call.op),
                                                 flat, chunk_bounds(flat.numel(), n))
    _copy_back(tensor, flat)
    _avg(tensor, call.op, n)


@recorded("reduce")
@torch.no_grad()
def reduce(tensor, dst, op=SUM, group=None, algorithm="auto"):
    prep = _prepare("reduce", algorithm, group, lambda n, rank: dict(
        dtype=tensor.dtype, count=tensor.numel(), op=parse_op(op), root=dst), (tensor,))
    if prep is None or tensor.numel() == 0:
        return
    n, rank, call, algorithm = prep
    # Non-root ranks work on a copy: algorithms accumulate into their buffer, and a caller's input
    # on a non-root rank is left as it was.
    if algorithm == "torch":
        flat = _flat(tensor) if rank == dst else tensor.reshape(-1).clone()
        gdst = dist.get_global_rank(group, dst) if group is not None else dst
        _torch_call("reduce", dist.reduce, flat, gdst, op=torch_op(call.op), group=group)
    else:
        c = _comm("reduce", algorithm, group, tensor, call.op)
        flat = _flat(tensor) if rank == dst else work(c, [tensor])
        registry.resolve("reduce", algorithm)(c, flat, chunk_bounds(flat.numel(), n), dst)
    if rank == dst:
        _copy_back(tensor, flat)
        _avg(tensor, call.op, n)


@recorded("broadcast")
@torch.no_grad()
def broadcast(tensor, src, group=None, algorithm="auto"):
    prep = _prepare("broadcast", algorithm, group, lambda n, rank: dict(
        dtype=tensor.dtype, count=tensor.numel(), root=src), (tensor,))
    if prep is None or tensor.numel() == 0:
        return
    n, _, _, algorithm = prep
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


@recorded("all_gather_into_tensor")
@torch.no_grad()
def all_gather_into_tensor(output, input, group=None, algorithm="auto"):
    def describe(n, rank):
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise ValueError(f"all_gather_into_tensor: output must have {n} x {input.numel()} elements "
                             f"of {input.dtype}, got {output.numel()} of {output.dtype}")
        return dict(dtype=input.dtype, count=output.numel())

    prep = _prepare("all_gather", algorithm, group, describe, (output, input))
    if prep is None or output.numel() == 0:
        return
    n, rank, _, algorithm = prep
    if algorithm == "torch":
        return _torch_call("all_gather", backend.all_gather_single, output, input, group=group)
    flat = _flat(output)
    bounds = chunk_bounds(flat.numel(), n)
    flat[bounds[rank]:bounds[rank + 1]].copy_(input.reshape(-1))
    _gather_like("all_gather", algorithm, group, flat, bounds)
    _copy_back(output, flat)


def _list_sizes(collective, role, tensors, n, rank, mine, whose) -> tuple[int, ...]:
    """The numel of each tensor of a list argument, checked against the group and this rank's tensor.

    Every rank must pass the same sizes (the handshake compares them); algorithm "torch" needs
    them equal, the others accept uneven ones.
    """
    sizes = tuple(t.numel() for t in tensors)
    if len(sizes) != n or sizes[rank] != mine:
        raise ValueError(f"{collective}: {role} needs {n} tensors and entry {rank} the {whose}'s {mine} "
                         f"elements; got {len(sizes)} tensors of sizes {list(sizes)}")
    return sizes


@recorded("all_gather")
@torch.no_grad()
def all_gather(tensor_list, tensor, group=None, algorithm="auto"):
    def describe(n, rank):
        sizes = _list_sizes("all_gather", "tensor_list", tensor_list, n, rank, tensor.numel(), "input")
        _torch_needs_equal("all_gather", algorithm, sizes, "ring, recursive_doubling and naive")
        return dict(dtype=tensor.dtype, count=sum(sizes), sizes=sizes)

    prep = _prepare("all_gather", algorithm, group, describe, (tensor_list, tensor))
    if prep is None:
        return
    _, rank, call, algorithm = prep
    if algorithm == "torch":
        return _torch_call("all_gather", dist.all_gather, tensor_list, tensor, group=group)
    bounds = bounds_from_sizes(call.sizes)
    c = _comm("all_gather", algorithm, group, tensor, Op.SUM)
    flat = work(c, extra=bounds[-1])
    flat[bounds[rank]:bounds[rank + 1]].copy_(tensor.reshape(-1))
    if bounds[-1]:
        registry.resolve("all_gather", algorithm)(c, flat, bounds)
    for i, t in enumerate(tensor_list):
        t.copy_(flat[bounds[i]:bounds[i + 1]].view(t.shape))


def _torch_needs_equal(collective, algorithm, sizes, others) -> None:
    if algorithm == "torch" and len(set(sizes)) > 1:
        raise ValueError(f"{collective}: algorithm 'torch' needs equal tensor sizes, got {list(sizes)}; "
                         f"{others} accept uneven ones")
