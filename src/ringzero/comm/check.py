"""The metadata handshake: ranks that disagree on a collective call fail together instead of hanging.

Before each checked collective every rank all-gathers one int64 vector of fixed length describing
its call (`Call`, encoded by `_encode`) with the backend's own all-gather, so the exchange itself
cannot disagree on message size whatever each rank is calling, and every rank reads the same table
and raises the same one-line error, or none. torch does the same for its own collectives under
TORCH_DISTRIBUTED_DEBUG=DETAIL: a fingerprint of sequence number, op type, dtypes and shapes
all-gathered before each collective (torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp; the
torch.distributed docs, "Debugging torch.distributed applications"). Compared, first difference
reported:

1. the call number: checked collectives this rank has entered on this group (`next_call`, counted
   before the arguments are read). Handshakes pair calls in order, so the numbers differ when a
   rank left a collective before its handshake (an exception its caller caught): that rank is
   ahead. Afterwards every rank continues from the largest number.
2. arguments a rank rejected (ValueError/TypeError): that rank still joins the handshake, and all
   ranks raise its error, so its peers do not wait for a collective it will never run.
3. the collective; then dtype, element count, op, root, the sizes of a tensor list, the algorithm
   asked for, the one that runs (auto's choice) and, for the node-aware algorithms (`hierarchical`, `hierarchical_2d`), the ranks per node.
4. all_to_all: the elements rank i sends rank j are what rank j expects from rank i (compared as
   digests, so the vector stays 13 integers whatever the group size).

A call that passes costs that one all-gather; one that fails may make a second (the rejected
calls' messages, the list sizes or the all_to_all sizes) to say exactly what differs.

A rank that skips a collective altogether is seen through what it calls next: a different call is
reported with what each rank called; an identical one pairs without complaint, and a skipped last
call leaves its peers waiting in the handshake until the launcher's timeout.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringzero.comm import backend
from ringzero.comm.ops import SUPPORTED_DTYPES, Op
from ringzero.comm.registry import COLLECTIVES, SPECIAL, TABLE

# The encoded call, one int64 each; the "agree" fields must be equal on every rank.
_NAMES = ("call", "error", "collective", "dtype", "element count", "op", "root", "tensor list sizes",
          "algorithm", "the algorithm auto chose", "ranks per node", "sent", "received")
(CALL, ERROR, COLLECTIVE, DTYPE, COUNT, OP, ROOT, SIZES, ALGORITHM, CHOSEN, NODE, SENT,
 RECEIVED) = range(len(_NAMES))
_AGREE = range(DTYPE, SENT)
_ERRORS = (None, ValueError, TypeError)
_P = (1 << 61) - 1            # digests are sums modulo this Mersenne prime: they fit an int64
_M = (1 << 64) - 1
_TEXT = 400                   # bytes of a rejected call's message exchanged on failure
_SHOWN = 4                    # distinct calls named in one message

_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Call:
    """One rank's validated view of a collective call: what the handshake compares."""

    collective: str
    algorithm: str
    dtype: torch.dtype
    count: int
    op: Op | None = None
    root: int | None = None
    sizes: tuple[int, ...] = ()   # list forms: the numel of every entry (same list on every rank)
    send: tuple[int, ...] = ()    # all_to_all: elements this rank sends to each rank
    recv: tuple[int, ...] = ()    # all_to_all: elements this rank receives from each rank
    priced: int | None = None     # elements algorithm="auto" prices (default `count`)


def next_call(group) -> int:
    """Count one more checked collective on `group` on this rank; returns its number (from 1)."""
    seq = _calls.get(group, 0) + 1
    _calls[group] = seq
    return seq


@functools.lru_cache(maxsize=None)
def _weight(a: int, b: int) -> int:
    """A fixed pseudo-random weight for the pair (a, b): splitmix64's output function (Steele, Lea
    & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014)."""
    z = ((a << 32) + b + 0x9E3779B97F4A7C15) & _M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return (z ^ (z >> 31)) % _P


def _digest(values, weight) -> int:
    return sum(v * weight(j) for j, v in enumerate(values)) % _P


def _index(collective: str, algorithm: str | None) -> int:
    names = SPECIAL + tuple(TABLE[collective])
    return names.index(algorithm) if algorithm in names else -1


def _encode(seq: int, call: Call | None, chosen: str | None, node: int, rank: int, n: int,
            collective: str, algorithm: str, error: BaseException | None) -> list[int]:
    row = [0] * len(_NAMES)
    row[CALL], row[COLLECTIVE] = seq, COLLECTIVES.index(collective)
    row[ALGORITHM] = _index(collective, algorithm)
    if error is not None:
        row[ERROR] = _ERRORS.index(type(error)) if type(error) in _ERRORS else 1
        return row
    row[DTYPE], row[COUNT] = SUPPORTED_DTYPES.index(call.dtype), call.count
    row[OP] = list(Op).index(call.op) if call.op is not None else -1
    row[ROOT] = -1 if call.root is None else call.root
    row[CHOSEN], row[NODE] = _index(collective, chosen), node
    if call.sizes:
        row[SIZES] = _digest(call.sizes, lambda j: _weight(j, n))
    if call.send:
        # the sums over ranks of SENT and RECEIVED are equal iff (but for a 2^-61 chance) what
        # each rank sends each other one is what that one expects
        row[SENT] = _digest(call.send, lambda j: _weight(rank, j))
        row[RECEIVED] = _digest(call.recv, lambda j: _weight(j, rank))
    return row


def verify(group, seq: int, call: Call | None, chosen: str | None, node: int,
           collective: str, algorithm: str, error: BaseException | None = None) -> None:
    """Exchange this rank's call with the group; raise the same error on every rank if they disagree.

    `error` is this rank's rejection of its own arguments (then `call` is None); it is raised on
    every rank. `node` is the ranks per node the chosen algorithm uses (0 where none is used).
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = _encode(seq, call, chosen, node, rank, n, collective, algorithm, error)
    table = _exchange(group, n, mine)
    first = table[0]
    if (first[ERROR] == 0 and all(row[:SENT] == first[:SENT] for row in table)
            and sum(r[SENT] for r in table) % _P == sum(r[RECEIVED] for r in table) % _P):
        return
    if any(row[CALL] != first[CALL] for row in table):
        _calls[group] = max(row[CALL] for row in table)
        raise ValueError(_call_numbers(table))
    if any(row[ERROR] for row in table):
        texts = _texts(group, n, "" if error is None else " ".join(str(error).split()))
        kinds = {_ERRORS[row[ERROR]] for row in table if row[ERROR]}
        raise (kinds.pop() if len(kinds) == 1 else ValueError)(_rejected(table, texts)) from error
    if any(row[COLLECTIVE] != first[COLLECTIVE] for row in table):
        raise ValueError(f"ranks disagree on the collective: {_calls_made(table)}")
    name = COLLECTIVES[first[COLLECTIVE]]
    fields = [_NAMES[i] for i in _AGREE if i != SIZES and any(row[i] != first[i] for row in table)]
    if fields:
        raise ValueError(f"{name}: ranks disagree on {' and '.join(fields)}: {_calls_made(table)}")
    if any(row[SIZES] != first[SIZES] for row in table):
        lists = _exchange(group, n, list(call.sizes))
        raise ValueError(f"{name}: ranks disagree on the sizes of the tensor list "
                         f"({_grouped([str(s) for s in lists])})")
    raise ValueError(f"{name}: {_unpaired(_exchange(group, n, list(call.send + call.recv)))}")


def _exchange(group, n: int, values: list[int]) -> list[list[int]]:
    vec = torch.tensor(values, dtype=torch.int64)
    rows = torch.empty(n, vec.numel(), dtype=torch.int64)
    backend.all_gather_single(rows.view(-1), vec, group=group)
    return rows.tolist()


def _texts(group, n: int, text: str) -> list[str]:
    """Every rank's message (a few hundred bytes each), exchanged only when some rank rejected its call."""
    raw = text.encode()[:_TEXT].ljust(_TEXT, b"\0")
    rows = _exchange(group, n, list(raw))
    return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]


def _ranks(ranks: list[int]) -> str:
    """"rank 3", or "ranks 0, 2-5"."""
    runs, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            runs.append(str(a) if a == start else f"{start}-{a}" if a > start + 1 else f"{start}, {a}")
            start = b
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


def _groups(values: list) -> list[tuple[list[int], object]]:
    """Ranks grouped by equal value, in order of each value's first rank."""
    by: dict = {}
    for r, v in enumerate(values):
        by.setdefault(v, []).append(r)
    return [(ranks, v) for v, ranks in by.items()]


def _grouped(values: list[str], sep: str = ": ") -> str:
    groups = _groups(values)
    parts = [f"{_ranks(ranks)}{sep}{v}" for ranks, v in groups[:_SHOWN]]
    if len(groups) > _SHOWN:
        parts.append(f"{sum(len(r) for r, _ in groups[_SHOWN:])} more ranks otherwise")
    return "; ".join(parts)


def _describe(row: list[int]) -> str:
    """What a rank called, e.g. "all_reduce(float32 x 8, op=sum, algorithm=auto (ring))"."""
    name = COLLECTIVES[row[COLLECTIVE]]
    algorithms = SPECIAL + tuple(TABLE[name])
    parts = [str(SUPPORTED_DTYPES[row[DTYPE]]).replace("torch.", "")]
    if name != "all_to_all":
        parts[0] += f" x {row[COUNT]}"
    if row[OP] >= 0:
        parts.append(f"op={list(Op)[row[OP]].value}")
    if row[ROOT] >= 0:
        parts.append(f"root={row[ROOT]}")
    algorithm, chosen = algorithms[row[ALGORITHM]], algorithms[row[CHOSEN]]
    parts.append(f"algorithm={algorithm}" + (f" ({chosen})" if chosen != algorithm else ""))
    if row[NODE]:
        parts.append(f"ranks_per_node={row[NODE]}")
    return f"{name}({', '.join(parts)})"


def _calls_made(table: list[list[int]]) -> str:
    return _grouped([_describe(row) if not row[ERROR] else "a call whose arguments it rejected"
                     for row in table], " called ")


def _be(ranks: list[int]) -> str:
    return "is" if len(ranks) == 1 else "are"


def _call_numbers(table: list[list[int]]) -> str:
    names = {row[COLLECTIVE] for row in table}
    prefix = f"{COLLECTIVES[names.pop()]}: " if len(names) == 1 else ""
    groups = sorted(_groups([row[CALL] for row in table]), key=lambda g: -g[1])
    if len(groups) == 2:
        (ahead, a), (behind, b) = groups
        more = "a collective" if a - b == 1 else f"{a - b} collectives"
        extra = "an extra one" if a - b == 1 else f"{a - b} extra ones"
        msg = (f"{_ranks(ahead)} {_be(ahead)} at call {a} on this group while {_ranks(behind)} "
               f"{_be(behind)} at call {b}: {_ranks(ahead)} skipped {more} or {_ranks(behind)} "
               f"made {extra}")
    else:
        at = _grouped([f"call {row[CALL]}" for row in table], " at ")
        msg = (f"ranks are at different calls on this group ({at}): the ranks ahead skipped "
               f"collectives or those behind made extra ones")
    if len({tuple(row[ERROR:SENT]) for row in table}) > 1:
        msg += f"; {_calls_made(table)}"
    return prefix + msg


def _rejected(table: list[list[int]], texts: list[str]) -> str:
    bad = [r for r, row in enumerate(table) if row[ERROR]]
    if len(bad) == len(table) and len(set(texts)) == 1:
        return texts[0]
    groups = _groups([texts[r] for r in bad])
    msg = "; ".join(f"{_ranks([bad[i] for i in ranks])}: {text}" for ranks, text in groups)
    good = [r for r in range(len(table)) if not table[r][ERROR]]
    return msg + (f" ({_ranks(good)} stop{'s' if len(good) == 1 else ''} too)" if good else "")


def _unpaired(rows: list[list[int]]) -> str:
    """The first pair (i, j) where what rank i sends differs from what rank j expects."""
    m = len(rows)
    for i in range(m):
        for j in range(m):
            if rows[i][j] != rows[j][m + i]:
                return f"rank {i} sends {rows[i][j]} elements to rank {j}, which expects {rows[j][m + i]}"
    return "the send and receive sizes do not pair up"
