"""The metadata handshake: ranks that disagree on a collective's shape fail fast instead of hanging.

Each rank all-gathers a fixed-size int64 vector describing its call (with the backend's own
all-gather, whose message size cannot disagree), and every rank compares the vectors and raises the
same one-line error naming the first field that differs and which ranks hold which value.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import backend
from .ops import SUPPORTED_DTYPES, Op
from .registry import COLLECTIVES, SPECIAL, TABLE

_FIELDS = ("collective", "algorithm", "op", "dtype", "element count", "root")


def _algorithm_id(collective: str, algorithm: str) -> int:
    names = SPECIAL + tuple(TABLE[collective])
    return names.index(algorithm)


def signature(collective: str, algorithm: str, op: Op | None, dtype: torch.dtype, count: int,
              root: int = -1) -> list[int]:
    ops = list(Op)
    return [COLLECTIVES.index(collective), _algorithm_id(collective, algorithm),
            ops.index(op) if op is not None else -1, SUPPORTED_DTYPES.index(dtype), count, root]


def _describe(field: str, value: int, collective: str) -> str:
    if field == "collective":
        return COLLECTIVES[value]
    if field == "algorithm":
        return (SPECIAL + tuple(TABLE[collective]))[value]
    if field == "op":
        return list(Op)[value].value if value >= 0 else "none"
    if field == "dtype":
        return str(SUPPORTED_DTYPES[value]).replace("torch.", "")
    return str(value)


def verify(group, collective: str, sig: list[int], extra: list[int] | None = None,
           extra_check=None) -> None:
    """All ranks exchange `sig` (+ `extra`) and raise the same ValueError if they disagree.

    `extra_check(rows)` may inspect the gathered extra vectors (all_to_all's size matrix) and return
    an error message or None.
    """
    n = dist.get_world_size(group)
    vec = torch.tensor(sig + (extra or []), dtype=torch.int64)
    rows = torch.empty(n, vec.numel(), dtype=torch.int64)
    backend.all_gather_single(rows.view(-1), vec, group=group)
    table = rows.tolist()
    for i, field in enumerate(_FIELDS):
        values = [row[i] for row in table]
        if len(set(values)) > 1:
            name = COLLECTIVES[table[0][0]]
            held = ", ".join(f"rank {r}: {_describe(field, v, name)}" for r, v in enumerate(values))
            raise ValueError(f"{collective}: ranks disagree on {field} ({held})")
    if extra_check is not None:
        msg = extra_check([row[len(sig):] for row in table])
        if msg:
            raise ValueError(f"{collective}: {msg}")
