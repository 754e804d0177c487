"""`ringzero` command line: parsing and dispatch only; every subcommand lives in its own module.

    ringzero bench comm --nproc 4 [--calibrate] [--compare] [--json] [--plot FILE.png]
    ringzero explain all-reduce --algorithm ring --world 4

Bad input exits with code 2 and one line naming what is wrong and what is allowed.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    # Imported here, not at module level, so `ringzero --help` stays fast.
    from .bench import comm as bench_comm
    from .comm import explain
    from .commands import plan as plan_cmd

    parser = argparse.ArgumentParser(prog="ringzero", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmarks (nccl-tests style)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    comm_p = bench_sub.add_parser("comm", help="every collective x algorithm x size on --nproc ranks")
    bench_comm.add_arguments(comm_p)
    comm_p.set_defaults(handler=bench_comm.run)

    explain_p = sub.add_parser("explain", help="step-by-step walk-through of a collective algorithm")
    explain.add_arguments(explain_p)
    explain_p.set_defaults(handler=explain.run)

    plan_p = sub.add_parser("plan", help="memory, communication and time of a training configuration")
    plan_cmd.add_arguments(plan_p)
    plan_p.set_defaults(handler=plan_cmd.run)
    return parser


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (UsageError, ValueError, TypeError, FileNotFoundError) as exc:
        print(f"ringzero: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
