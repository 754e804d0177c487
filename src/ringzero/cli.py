"""ringzero: train one large model on many devices, plan it, and check the plan against the run.

ringzero runs the collectives (every classic all-reduce algorithm), data parallelism and ZeRO-1/2/3
on real torch.distributed ranks; plans parameters, FLOPs, memory, bytes on the wire and step time
for any model and cluster; and prints every predicted number beside its measured twin.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import signal
import sys
import threading
import traceback

from ringzero.errors import Terminated, UsageError
from ringzero.rank_io import in_torchrun

EXAMPLES = """examples:
  ringzero train --nproc 4 --strategy zero2 --recompute selective --steps 200
  ringzero plan --model llama-2-7b --gpus 8 --gpu a100-80gb --zero 3 --search
  ringzero bench comm --nproc 4 --collective all_reduce --compare
  ringzero explain all-reduce --algorithm ring --world 4
  ringzero analyze traces/

`ringzero COMMAND --help` shows a command's options. Bad input exits with code 2 and one line
naming what is wrong; a failure while running exits with code 1 and one line naming the rank and
its error (--debug or RINGZERO_DEBUG=1 adds the traceback)."""

# command -> (module with add_arguments/run, help); "bench" has sub-commands of its own.
COMMANDS = {
    "train": ("ringzero.commands.train", "train a GPT on --nproc ranks and compare it with the plan"),
    "plan": ("ringzero.commands.plan", "memory, communication and time of a training configuration"),
    "bench": (None, "benchmarks against the peer in the same run (comm, train)"),
    "explain": ("ringzero.comm.explain", "step-by-step walk-through of a collective algorithm"),
    "checkpoint": ("ringzero.commands.checkpoint", "inspect a checkpoint, or consolidate it into one file"),
    "analyze": ("ringzero.commands.analyze", "what a traced or reported run spent its steps on, and its bottleneck"),
    "simulate": (None, "the same schedules played on a modelled cluster of thousands of GPUs"),
}
BENCHES = {
    "comm": ("ringzero.bench.comm", "every collective x algorithm x size on --nproc ranks"),
    "train": ("ringzero.bench.train", "ringzero's strategies against torch DDP and FSDP2"),
    "ps": ("ringzero.bench.ps", "all-reduce DP against a sync, async and SSP parameter server under a straggler"),
}

SIMULATIONS = {
    "collective": ("ringzero.commands.simulate_collective", "one collective on a modelled cluster, as nccl-tests prints it"),
    "step": ("ringzero.commands.simulate_step", "one training step on a modelled cluster, beside the planner's"),
}
NESTED = {"bench": ("bench_command", "BENCH", BENCHES), "simulate": ("simulate_command", "SIMULATION", SIMULATIONS)}
"""Commands made of sub-commands: (the attribute naming the one chosen, its metavar, the table)."""

RANKED = ("train", "bench")
"""The commands that start ranks: only their interruption has ranks to stop."""

VALUE_LIKE_FLAG = re.compile(r"^-\.?[0-9]")
"""A flag's value that starts with a minus and a digit ("-1:2", "-1,5", "-4KiB", "-.5"): argparse
takes only plain negative numbers for values and reads the rest as an unknown option ("expected one
argument"), so the value never reaches the check that names the field and what it allows. No
option of ringzero starts with a digit, so such a string is always a value."""


class Parser(argparse.ArgumentParser):
    """argparse, with a parse error as one line (exit 2) instead of the usage block and the error,
    and a mistyped option answered with the closest of the command's own ("did you mean")."""

    _close: dict[str, str] = {}
    """Unknown option -> the closest option of the (sub)command that met it. argparse reports the
    unknown arguments from the top-level parser, which does not hold a sub-command's options, so
    each parser notes its guesses as it parses."""

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        options = [o for o in self._option_string_actions if o.startswith("--")]
        for token in extras:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in Parser._close:
                close = difflib.get_close_matches(flag, options, n=1, cutoff=0.75)
                if close:
                    Parser._close[flag] = close[0]
        return ns, extras

    def error(self, message: str):
        # A flag's own type (`plan.units.BandwidthFlag`) names the flag already: say it once.
        message = re.sub(r"^argument (--[\w-]+): (?=\1)", "", message)
        if message.startswith("unrecognized arguments:"):
            unknown = [t.split("=", 1)[0] for t in message.split(":", 1)[1].split()]
            guesses = [(flag, Parser._close[flag]) for flag in unknown if flag in Parser._close]
            if len(guesses) == 1:
                message += f"; did you mean {guesses[0][1]}?"
            elif guesses:
                message += "; did you mean " + ", ".join(f"{g} for {f}" for f, g in guesses) + "?"
        print(f"ringzero: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def version() -> str:
    try:
        from importlib.metadata import version as dist_version
        return dist_version("ringzero")
    except Exception:
        from ringzero import __version__
        return __version__


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser. Every command is listed, but only `only`'s module is imported (and its options
    added), so `ringzero --help` and `ringzero plan` never import torch."""
    import importlib

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of a failure")
    doc = __doc__.split("\n\n", 1)
    parser = Parser(prog="ringzero", description=doc[0].split(": ", 1)[1] + "\n\n" + doc[1].strip(),
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser._negative_number_matcher = VALUE_LIKE_FLAG
    parser.add_argument("--version", action="version", version=f"ringzero {version()}")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show the full traceback of a failure (also RINGZERO_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands", parser_class=Parser)

    def add(parent, name: str, module: str | None, help: str, wanted: bool):
        p = parent.add_parser(name, help=help, description=help, parents=[common])
        if wanted and module:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(handler=mod.run)
        p._negative_number_matcher = VALUE_LIKE_FLAG      # after add_arguments: options are not values
        return p

    for name, (module, help) in COMMANDS.items():
        p = add(sub, name, module, help, only == name)
        if name in NESTED:
            dest, metavar, table = NESTED[name]
            nested = p.add_subparsers(dest=dest, required=True, metavar=metavar, parser_class=Parser)
            for sname, (smodule, shelp) in table.items():
                add(nested, sname, smodule, shelp, only == name)
    return parser


UNWIND_S = 20.0
"""After Ctrl-C or SIGTERM the launcher unwinds (stops its ranks, closes its pipes and threads);
should that itself hang, the process exits this many seconds later anyway, its ranks killed."""
_said = threading.Event()
_timers: list[threading.Timer] = []


def _exit_after(seconds: float, code: int, line: str) -> None:
    """Arm a daemon timer: if the process is still alive `seconds` from now, kill its child
    processes, say `line` (unless the unwinding said it already) and exit with `code`."""
    def hard_exit() -> None:
        import multiprocessing
        for child in multiprocessing.active_children():
            child.kill()
        if not _said.is_set():
            print(line, file=sys.stderr, flush=True)
        os._exit(code)
    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()
    _timers.append(timer)


def _raise_interrupted(signum, frame):
    _exit_after(UNWIND_S, 128 + signum, "ringzero: interrupted (Ctrl-C); every rank was stopped")
    raise KeyboardInterrupt


def _raise_terminated(signum, frame):
    _exit_after(UNWIND_S, 128 + signum, f"ringzero: stopped by signal {signum} (SIGTERM); every rank was stopped")
    raise Terminated(signum)


def _fail(exc: BaseException, debug: bool) -> int:
    """One line for a runtime failure (exit 1); the traceback only with --debug."""
    from_rank = hasattr(exc, "summary") and hasattr(exc, "stderr_tail")
    if debug:
        traceback.print_exception(exc)
    if from_rank:
        print(f"ringzero: error: {exc.summary}", file=sys.stderr)
        for line in exc.stderr_tail:
            print(f"  rank {exc.rank} stderr: {line}", file=sys.stderr)
    elif isinstance(exc, (OSError, RuntimeError, MemoryError, TimeoutError)):
        print(f"ringzero: error: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        print(f"ringzero: internal error: {type(exc).__name__}: {exc} (a bug in ringzero; "
              f"--debug shows where)", file=sys.stderr)
    return 1


def _stopped(command: str | None) -> str:
    """What an interruption of `command` stopped besides this process."""
    return "; every rank was stopped" if command in RANKED else ""


def main(argv: list[str] | None = None) -> int:
    program = argv is None             # the `ringzero` command, not a call from Python
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    debug = "--debug" in argv or os.environ.get("RINGZERO_DEBUG", "0") not in ("", "0")
    # SIGTERM unwinds the launcher so that it stops its ranks. A torchrun rank keeps the default
    # (die at once): its agent sends SIGTERM while the rank may be blocked in a collective.
    main_thread = threading.current_thread() is threading.main_thread() and not in_torchrun()
    old = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    old_int = signal.signal(signal.SIGINT, _raise_interrupted) if main_thread and first in RANKED else None
    try:
        try:
            args = build_parser(first if first in COMMANDS else None).parse_args(argv)
            args.argv = list(argv)         # what a report keeps to be rerun (`ringzero analyze --try-best`)
        except SystemExit as exc:          # --help, --version, or a parse error already printed
            return exc.code if isinstance(exc.code, int) else 0
        return int(args.handler(args) or 0)
    except UsageError as exc:
        print(f"ringzero: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ringzero: interrupted (Ctrl-C){_stopped(first)}", file=sys.stderr, flush=True)
        _said.set()
        return 128 + signal.SIGINT
    except Terminated as exc:
        print(f"ringzero: stopped by signal {exc.signum} (SIGTERM){_stopped(first)}", file=sys.stderr, flush=True)
        _said.set()
        return 128 + exc.signum
    except Exception as exc:
        return _fail(exc, debug)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old)
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)
        if not program:                # a caller in Python lives on: no exit after it returns
            for timer in _timers:
                timer.cancel()
            _timers.clear()


if __name__ == "__main__":
    sys.exit(main())
