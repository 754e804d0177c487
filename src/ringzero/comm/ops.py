"""Reduction operators and the dtypes each one allows.

`ringzero.comm` accepts `torch.distributed.ReduceOp` members or the strings "sum", "avg", "min",
"max", "product" ("prod" too). AVG is computed as SUM followed by one division by the group size,
which is what NCCL does and the only way gloo (which has no AVG) can offer it; it therefore needs a
floating-point dtype.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist


class Op(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"


_ALIASES = {"prod": Op.PRODUCT, "mean": Op.AVG}
SUPPORTED_DTYPES = (
    torch.float32, torch.float64, torch.bfloat16, torch.float16,
    torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8,
)


def parse_op(op) -> Op:
    """Turn a ReduceOp member or a name into an `Op`; anything else raises one clear line."""
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        key = op.lower()
        if key in _ALIASES:
            return _ALIASES[key]
        try:
            return Op(key)
        except ValueError:
            pass
    else:
        for name in ("SUM", "AVG", "MIN", "MAX", "PRODUCT"):
            if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
                return Op[name]
    valid = ", ".join(o.value for o in Op)
    raise ValueError(f"unsupported reduce op {op!r}; allowed: {valid}")


def check_dtype(dtype: torch.dtype, op: Op | None, collective: str) -> None:
    """Reject dtypes ringzero does not move or reduce, naming the combination."""
    if dtype not in SUPPORTED_DTYPES:
        allowed = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise TypeError(f"{collective}: dtype {dtype} is not supported; allowed: {allowed}")
    if op is Op.AVG and not dtype.is_floating_point:
        raise TypeError(f"{collective}: op avg needs a floating-point dtype, got {dtype}")


def reducer(op: Op):
    """In-place elementwise `dst = op(dst, src)` for 1-D tensors of the same length."""
    if op in (Op.SUM, Op.AVG):
        return lambda dst, src: dst.add_(src)
    if op is Op.PRODUCT:
        return lambda dst, src: dst.mul_(src)
    if op is Op.MIN:
        return lambda dst, src: torch.minimum(dst, src, out=dst)
    return lambda dst, src: torch.maximum(dst, src, out=dst)


def torch_op(op: Op):
    """The backend ReduceOp that computes `op` (AVG is SUM, divided afterwards by the caller)."""
    return {
        Op.SUM: dist.ReduceOp.SUM, Op.AVG: dist.ReduceOp.SUM, Op.MIN: dist.ReduceOp.MIN,
        Op.MAX: dist.ReduceOp.MAX, Op.PRODUCT: dist.ReduceOp.PRODUCT,
    }[op]
