"""`ringzero checkpoint`: look into a checkpoint, or make one full-model file of it.

    ringzero checkpoint inspect ckpt/                      # its latest: step, layout, sizes, tensors
    ringzero checkpoint inspect ckpt/ --verify             # and every shard read and checked
    ringzero checkpoint consolidate ckpt/step-00000200 --out model.safetensors [--with-optimizer]

A checkpoint is a folder written by `ringzero train --save-dir` (or a --save-dir itself: its
latest complete checkpoint). Everything is checked before anything is written: a bad path is one
line, exit code 2, and no output file; --out never writes into a checkpoint or over a save
folder's `latest` or step-NNNNNNNN names (`checkpoint.folders.claimed`).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(p))
    i = sub.add_parser("inspect", help="step, layout, sizes and a table of the tensors")
    i.add_argument("path", help="a checkpoint folder, or a --save-dir (its latest)")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    i.add_argument("--verify", action="store_true",
                   help="check what loading checks: the pieces make up every tensor whole, and every shard is "
                        "a regular file of the folder with its size, CRC-32, run id, each piece's dtype and size, "
                        "every weight and optimizer state finite")
    c = sub.add_parser("consolidate", help="write one full-model safetensors file, tensor by tensor")
    c.add_argument("path", help="a checkpoint folder, or a --save-dir (its latest)")
    c.add_argument("--out", required=True, metavar="FILE.safetensors",
                   help="the file to write: every weight whole, as one model on one rank would hold it")
    c.add_argument("--with-optimizer", action="store_true", help="also Adam's moments (exp_avg, exp_avg_sq)")


def _sizes(m) -> tuple[int, int]:
    """(bytes of the weights as saved, bytes in all)."""
    import math
    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    per = {n: math.prod(e.shape) * size[e.dtype] for n, e in m.tensors.items()}
    return sum(v for n, v in per.items() if n.startswith("param/")), sum(per.values())


def inspect(directory: str, m, as_json: bool, verified=None) -> None:
    from rich.console import Console
    from rich.table import Table
    if as_json:
        print(m.to_json())
        return
    c = Console()
    lay = m.layout
    weights, total = _sizes(m)
    c.print(f"{directory}: step {m.step}, optimizer step {m.optimizer_step}, run {m.run or '(none: format 1)'}"
            + (f", lineage of {len(m.lineage)} run{'s' if len(m.lineage) > 1 else ''}" if m.lineage else ""))
    c.print("layout: " + ", ".join(f"{k} {v}" for k, v in lay.items()))
    c.print(f"files: {len(m.files())}; weights {weights / 2**20:.2f} MiB, all tensors {total / 2**20:.2f} MiB")
    t = Table(title="tensors (global shapes)")
    for col in ("name", "shape", "dtype", "pieces"):
        t.add_column(col, justify="right" if col == "pieces" else "left")
    for name, e in m.tensors.items():
        t.add_row(name, "x".join(map(str, e.shape)), e.dtype, str(len(e.pieces)))
    c.print(t)
    if verified is None:
        c.print("read the manifest only; --verify reads every shard and checks it against the manifest")
    else:
        c.print(f"verified: {verified.files} files, {verified.bytes / 2**20:.2f} MiB, "
                + ("CRC-32 of each as the manifest's, " if verified.summed else "no CRC-32s in a format-1 manifest, ")
                + f"every piece's dtype and size as its header's, {verified.tensors} tensors finite")


def run(args: argparse.Namespace) -> int:
    from ringzero import outputs
    from ringzero.errors import UsageError, usage
    verified = None
    with usage():
        from ringzero.checkpoint.folders import not_claimed, resolve
        from ringzero.checkpoint.manifest import CheckpointError, read
        from ringzero.checkpoint.verify import verify
        directory = resolve(args.path)
        m = read(directory)
        if args.action == "consolidate":
            out = outputs.check(args.out, "--out")
            outputs.not_an_input(args.out, "--out", {"the checkpoint": directory})
            not_claimed(args.out, "--out")
            verify(directory, m, deep=True)
        elif args.verify:
            verified = verify(directory, m, deep=True)
    if args.action == "inspect":
        inspect(directory, m, args.json, verified)
        return 0
    from ringzero.checkpoint.consolidate import consolidate
    count = []
    try:
        outputs.write_with(out, lambda f: count.append(consolidate(directory, f, args.with_optimizer)), binary=True)
    except CheckpointError as exc:      # a checkpoint that cannot be used (its temporary is gone): bad input
        raise UsageError(str(exc)) from None
    print(f"wrote {args.out}: {count[0]} tensors from {directory}", file=sys.stderr)
    return 0
