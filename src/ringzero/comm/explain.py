"""`ringzero explain`: a collective algorithm, step by step, on symbolic chunks (a0, b1, …).

    ringzero explain all-reduce --algorithm ring --world 4

prints the textbook walk-through of the ring on 4 GPUs A-D: step 1 "A → B: a0", "B → C: b1",
"C → D: c2", "D → A: d3", then what every rank holds (B's chunk 0 is now a0+b0), and so on until
every rank holds a0+b0+c0+d0 … a3+b3+c3+d3; then the planner's totals (rounds, bytes and messages
per rank) for a message of `--bytes`, all formatted by `ringzero.comm.explain_render`. Nothing here
knows how an algorithm works: `explain()` runs the function in `ringzero.comm.registry` on the
symbolic Comm of `ringzero.comm.symbolic`, with one element per chunk so that element i is chunk i.
Rank r's input element i is the term letter(r)+i:

- all_reduce, reduce, reduce_scatter: rank r holds r0 … r(n-1) (every rank a full buffer);
- all_gather, gather: rank r holds its own chunk r (a0 on A, b1 on B, …);
- broadcast, scatter: the root holds every chunk, the others nothing;
- all_to_all: rank r's send chunk j is rj; the table shows the receive buffers.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys

import numpy as np

from ringzero.errors import usage
from ringzero.plan.comm.volume import ROOTED, WHOLE_BUFFER, Volume, call_for, volume
from ringzero.plan.units import NEGATIVE_VALUE, parse_size
from ringzero.comm import registry, symbolic
# as_dict and render are re-exported: they were defined in this module.
from ringzero.comm.explain_render import as_dict, render  # noqa: F401
from ringzero.comm.explanation import ITEMSIZE, Explanation
from ringzero.comm.symbolic_values import Sym

MAX_WORLD = 16
"""One letter per rank, and a table that still fits a terminal."""

DEFAULT_BYTES = 1 << 20


def normalize(collective: str) -> str:
    """'all-reduce' -> 'all_reduce'; unknown names raise one line listing the valid ones."""
    name = collective.strip().lower().replace("-", "_")
    if name not in registry.TABLE:
        valid = ", ".join(c.replace("_", "-") for c in registry.COLLECTIVES)
        raise ValueError(f"unknown collective {collective!r}; valid: {valid} ('-' or '_')")
    return name


def _check(collective: str, algorithm: str, world: int, root: int, ranks_per_node: int | None) -> None:
    if algorithm not in registry.TABLE[collective]:
        valid = ", ".join(registry.algorithms(collective))
        special = (" ('auto' and 'torch' have no steps of their own to show)"
                   if algorithm in registry.SPECIAL else "")
        raise ValueError(f"cannot explain algorithm {algorithm!r} for {collective}; valid: {valid}{special}")
    if not 1 <= world <= MAX_WORLD:
        raise ValueError(f"world must be between 1 and {MAX_WORLD} (one letter per rank), got {world}")
    if collective in ROOTED and not 0 <= root < world:
        raise ValueError(f"root {root} is not a rank of a world of {world}; allowed: 0..{world - 1}")
    if collective not in ROOTED and root != 0:
        raise ValueError(f"--root applies only to {', '.join(ROOTED)}, not to {collective}")
    if ranks_per_node is not None and ranks_per_node < 1:
        raise ValueError(f"ranks per node must be >= 1, got {ranks_per_node}")


def _setup(collective: str, n: int, root: int):
    """Per rank: the algorithm's arguments after the Comm, and the buffer the tables show."""
    bounds = list(range(n + 1))  # one element per chunk: element i is chunk i

    def filled(rank: int, which) -> np.ndarray:
        buf = np.empty(n, dtype=object)
        for i in which:
            buf[i] = Sym.term(rank, i)
        return buf

    def setup(r: int):
        if collective == "all_to_all":
            rbuf = np.empty(n, dtype=object)
            return (filled(r, range(n)), bounds, rbuf, list(bounds)), rbuf
        if collective in ("all_gather", "gather"):
            buf = filled(r, [r])
        elif collective in ("broadcast", "scatter"):
            buf = filled(root, range(n) if r == root else [])
        else:
            buf = filled(r, range(n))
        return ((buf, bounds, root) if collective in ROOTED else (buf, bounds)), buf

    return setup


def explain(collective: str, algorithm: str, world: int, root: int = 0,
            ranks_per_node: int | None = None) -> Explanation:
    """Run `algorithm` for `collective` on `world` symbolic ranks and collect its steps."""
    collective = normalize(collective)
    _check(collective, algorithm, world, root, ranks_per_node)
    fn = registry.resolve(collective, algorithm)
    setup = _setup(collective, world, root)
    inputs = [setup(r)[0][0] for r in range(world)]  # the first argument is the input buffer
    rpn = max(1, min(ranks_per_node or world, world))  # as CommConfig.node_size
    try:
        trace = symbolic.run(fn, world, setup, itemsize=ITEMSIZE, ranks_per_node=rpn)
    except symbolic.SymbolicError as exc:
        raise symbolic.SymbolicError(f"{collective} {algorithm} on {world} ranks: {exc}") from exc
    last = max((m.step for m in trace.messages), default=0)
    holdings = tuple(tuple(_at(snaps, s) for snaps in trace.snapshots) for s in range(1, last + 1))
    doc = (inspect.getdoc(fn) or "").splitlines()
    return Explanation(collective=collective, algorithm=algorithm, world=world, root=root,
                       ranks_per_node=ranks_per_node, summary=doc[0] if doc else "",
                       initial=tuple(tuple(b) for b in inputs), messages=trace.messages,
                       holdings=holdings, final=tuple(snaps[-1][1] for snaps in trace.snapshots),
                       rounds=trace.rounds)


def _at(snapshots, step: int) -> tuple:
    """The buffer after every change stamped `step` or earlier."""
    return [buf for s, buf in snapshots if s <= step][-1]


def element_count(collective: str, world: int, nbytes: int) -> int:
    """float32 elements the totals use for about `nbytes`: whole elements, and for collectives whose
    buffer is one equal chunk per rank a multiple of `world` (as `call_for` requires)."""
    count = max(0, nbytes) // ITEMSIZE
    if collective not in WHOLE_BUFFER and collective != "all_to_all":
        count -= count % world
    return count


def check_bytes(collective: str, world: int, nbytes: int, text: str) -> None:
    """Refuse a --bytes that holds no element (the totals would silently describe an empty call)."""
    if element_count(collective, world, nbytes) == 0:
        whole = collective in WHOLE_BUFFER or collective == "all_to_all"
        least = ITEMSIZE if whole else ITEMSIZE * world
        per = "" if whole else f" per rank on {world} ranks"
        raise ValueError(f"--bytes {text} holds no float32 element{per}; allowed: {least} B or more")


def totals(collective: str, algorithm: str, world: int, nbytes: int, root: int = 0,
           ranks_per_node: int | None = None) -> tuple[int, list[Volume]]:
    """The planner's per-rank traffic for a float32 message of about `nbytes` (element count, list)."""
    count = element_count(collective, world, nbytes)
    call = call_for(collective, algorithm, world, count, ITEMSIZE, root, ranks_per_node)
    return count, [volume(call, r) for r in range(world)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # argparse reads "--bytes -4KiB" as a flag missing its value; let a negative size reach its check.
    if hasattr(parser, "_negative_number_matcher"):
        parser._negative_number_matcher = NEGATIVE_VALUE
    parser.add_argument("collective", help="all-reduce, all-gather, reduce-scatter, broadcast, reduce, "
                        "gather, scatter or all-to-all ('-' or '_')")
    parser.add_argument("--algorithm", default=None,
                        help="an algorithm of the collective (default: ring, else the first listed)")
    parser.add_argument("--world", type=int, default=4, help=f"number of ranks, 1..{MAX_WORLD} (default 4)")
    parser.add_argument("--root", type=int, default=0, help="root of reduce, broadcast, gather, scatter")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="ranks per node for hierarchical (default: one node)")
    parser.add_argument("--bytes", default=str(DEFAULT_BYTES),
                        help="message size for the planner's totals, e.g. 1MiB (2^20 B) or 1MB (10^6 B) "
                        "(default 1 MiB of float32)")
    parser.add_argument("--json", action="store_true", help="print plain data instead of tables")


def run(args: argparse.Namespace) -> int:
    with usage():
        collective = normalize(args.collective)
        algorithm = args.algorithm or ("ring" if "ring" in registry.TABLE[collective]
                                       else registry.algorithms(collective)[0])
        _check(collective, algorithm, args.world, args.root, args.ranks_per_node)
        nbytes = parse_size(args.bytes, "--bytes")
        check_bytes(collective, args.world, nbytes, args.bytes)
    try:
        ex = explain(collective, algorithm, args.world, args.root, args.ranks_per_node)
    except symbolic.SymbolicError as exc:
        print(f"ringzero: error: {exc}", file=sys.stderr)
        return 1
    count, vols = totals(collective, algorithm, args.world, nbytes, args.root, args.ranks_per_node)
    if args.json:
        print(json.dumps(as_dict(ex, count, vols)))
    else:
        render(ex, count, vols)
    return 0
