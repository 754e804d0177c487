"""`ringzero` command line: parsing and dispatch only; every subcommand lives in its own module.

    ringzero bench comm --nproc 4 [--calibrate] [--compare] [--json] [--plot FILE.png]
    ringzero explain all-reduce --algorithm ring --world 4
    ringzero plan --model llama-2-7b --gpus 8 --gpu a100-80gb --zero 3 [--search] [--json]
    ringzero train --nproc 4 --strategy zero2 --precision bf16 --recompute selective --steps 200

Bad input exits with code 2 and one line naming what is wrong and what is allowed.
"""

from __future__ import annotations

import argparse
import sys


# command -> (module with add_arguments/run, help); "bench" has sub-commands of its own.
COMMANDS = {
    "plan": ("ringzero.commands.plan", "memory, communication and time of a training configuration"),
    "train": ("ringzero.commands.train", "train a GPT on --nproc ranks and compare it with the plan"),
    "explain": ("ringzero.comm.explain", "step-by-step walk-through of a collective algorithm"),
}
BENCHES = {
    "comm": ("ringzero.bench.comm", "every collective x algorithm x size on --nproc ranks"),
    "train": ("ringzero.bench.train", "ringzero's strategies against torch DDP and FSDP2"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that command's (so `ringzero plan` never imports torch)."""
    import importlib

    parser = argparse.ArgumentParser(prog="ringzero", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(parent, name: str, module: str, help: str) -> None:
        mod = importlib.import_module(module)
        p = parent.add_parser(name, help=help)
        mod.add_arguments(p)
        p.set_defaults(handler=mod.run)

    for name, (module, help) in COMMANDS.items():
        if only in (None, name):
            add(sub, name, module, help)
    if only in (None, "bench"):
        bench = sub.add_parser("bench", help="benchmarks against the peer in the same run")
        bench_sub = bench.add_subparsers(dest="bench_command", required=True)
        for name, (module, help) in BENCHES.items():
            add(bench_sub, name, module, help)
    return parser


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = argv[0] if argv else None
    parser = build_parser(first if first in COMMANDS or first == "bench" else None)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (UsageError, ValueError, TypeError, FileNotFoundError) as exc:
        print(f"ringzero: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
