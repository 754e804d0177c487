"""`ringzero checkpoint`: look into a checkpoint, or make one full-model file of it.

    ringzero checkpoint inspect ckpt/                      # its latest: step, layout, sizes, tensors
    ringzero checkpoint consolidate ckpt/step-00000200 --out model.safetensors [--with-optimizer]

A checkpoint is a folder written by `ringzero train --save-dir` (or a --save-dir itself: its
latest complete checkpoint). Everything is checked before anything is written: a bad path is one
line, exit code 2, and no output file.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(p))
    i = sub.add_parser("inspect", help="step, layout, sizes and a table of the tensors")
    i.add_argument("path", help="a checkpoint folder, or a --save-dir (its latest)")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    c = sub.add_parser("consolidate", help="write one full-model safetensors file, tensor by tensor")
    c.add_argument("path", help="a checkpoint folder, or a --save-dir (its latest)")
    c.add_argument("--out", required=True, metavar="FILE.safetensors")
    c.add_argument("--with-optimizer", action="store_true", help="also Adam's moments (exp_avg, exp_avg_sq)")


def _sizes(m) -> tuple[int, int]:
    """(bytes of the weights as saved, bytes in all)."""
    import math
    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    per = {n: math.prod(e.shape) * size[e.dtype] for n, e in m.tensors.items()}
    return sum(v for n, v in per.items() if n.startswith("param/")), sum(per.values())


def inspect(path: str, as_json: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..checkpoint.load import resolve
    from ..checkpoint.manifest import read
    directory = resolve(path)
    m = read(directory)
    if as_json:
        print(m.to_json())
        return
    c = Console()
    lay = m.layout
    weights, total = _sizes(m)
    c.print(f"{directory}: step {m.step}, optimizer step {m.optimizer_step}")
    c.print("layout: " + ", ".join(f"{k} {v}" for k, v in lay.items()))
    c.print(f"files: {len(m.files())}; weights {weights / 2**20:.2f} MiB, all tensors {total / 2**20:.2f} MiB")
    t = Table(title="tensors (global shapes)")
    for col in ("name", "shape", "dtype", "pieces"):
        t.add_column(col, justify="right" if col == "pieces" else "left")
    for name, e in m.tensors.items():
        t.add_row(name, "x".join(map(str, e.shape)), e.dtype, str(len(e.pieces)))
    c.print(t)


def check_files(directory: str, m) -> None:
    """CheckpointError unless every file the manifest `m` lists is in `directory`, reads as
    safetensors and holds the tensors it names (headers only: nothing is loaded)."""
    from safetensors import safe_open

    from ..checkpoint.manifest import CheckpointError
    keys: dict[str, set[str]] = {name: set() for name in m.files()}
    for e in m.tensors.values():
        for p in e.pieces:
            keys[p.file].add(p.key)
    for name, wanted in keys.items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"{directory} is not a complete checkpoint: its manifest lists {name}, "
                                  "which is missing")
        try:
            with safe_open(path, framework="pt") as f:
                missing = sorted(wanted - set(f.keys()))
        except Exception as exc:  # noqa: BLE001 - OSError, or safetensors' own error for a bad file
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        if missing:
            raise CheckpointError(f"{path} has no tensor {missing[0]!r} that the manifest lists")


def run(args: argparse.Namespace) -> int:
    from .. import outputs
    from ..errors import UsageError, usage
    with usage():
        from ..checkpoint.load import resolve
        from ..checkpoint.manifest import CheckpointError, read
        directory = resolve(args.path)
        m = read(directory)
        if args.action == "consolidate":
            check_files(directory, m)
            out = outputs.check(args.out, "--out")
    if args.action == "inspect":
        inspect(args.path, args.json)
        return 0
    from ..checkpoint.consolidate import consolidate
    count = []
    try:
        outputs.write_with(out, lambda f: count.append(consolidate(directory, f, args.with_optimizer)), binary=True)
    except CheckpointError as exc:      # a checkpoint that cannot be used (its temporary is gone): bad input
        raise UsageError(str(exc)) from None
    print(f"wrote {args.out}: {count[0]} tensors from {directory}", file=sys.stderr)
    return 0
