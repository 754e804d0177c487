"""The parts of the GPU check: what each one runs, and running one under its timeout.

A part is a command line with a timeout, the JSON report it writes (if any) and the kind that says
how `gpu_check.summary` reads its numbers. Every part runs in a session of its own, so that on a
timeout the whole tree (torchrun's agent and its ranks) is stopped, not only the agent: a rank left
behind would hold its GPU and the port of the next rendezvous.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

KINDS = ("pytest", "train", "bench_comm", "nccl_comm")

# Seconds per part, chosen so that the whole check stays within ~10 minutes (90 + 4 x 75 + 90 +
# 120 = 600 s at worst); on a 16-core GPU host a 2-rank nano run of 30 steps takes ~10-20 s
# (`time torchrun --nproc-per-node 2 -m ringzero.cli train --micro-batch 4 --steps 30 --quiet`).
PYTEST_S, TRAIN_S, BENCH_S, NCCL_S = 90.0, 75.0, 90.0, 120.0

STRATEGIES: dict[str, tuple[str, ...]] = {
    "dp": ("--strategy", "dp"),
    "zero3": ("--strategy", "zero3"),
    "tp": ("--tp", "2"),
    "pp": ("--pp", "2", "--grad-accum", "4"),
}
"""The 2-rank layouts trained under torchrun, as `ringzero train` flags."""

ENV = {"NCCL_DEBUG": "INFO", "PYTHONUNBUFFERED": "1"}
"""NCCL_DEBUG=INFO makes NCCL log a line for every communicator it builds: a part whose output has
none never used NCCL (`summary.nccl_log_lines`). Unbuffered, so a killed part's tail is complete."""

TAIL_CHARS = 4000


@dataclass(frozen=True)
class Part:
    name: str
    kind: str
    argv: tuple[str, ...]
    timeout_s: float
    report: str | None = None
    """The JSON file the command writes (train, nccl_comm); None: its numbers are in its stdout."""
    cwd: str | None = None
    note: str | None = None
    """Said in the summary beside the numbers (e.g. a world cut to the devices there are)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"part kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.argv:
            raise ValueError(f"part {self.name!r} has no command")
        if not self.timeout_s > 0:
            raise ValueError(f"part {self.name!r} needs a timeout > 0 s, got {self.timeout_s}")


@dataclass(frozen=True)
class Finished:
    """What a part's command did: exit code (None when it was stopped), its output, how long."""

    rc: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool

    def tail(self, chars: int = TAIL_CHARS) -> str:
        return (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr)[-chars:]


def torchrun(nproc: int, *command: str) -> tuple[str, ...]:
    """`torchrun --standalone --nproc-per-node nproc COMMAND` through this interpreter."""
    return (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            *command)


def pytest_part(tests: str) -> Part:
    return Part("pytest-cuda", "pytest", (sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p",
                                          "no:cacheprovider", tests), PYTEST_S, cwd=os.path.dirname(tests))


def train_part(strategy: str, steps: int, report: str) -> Part:
    argv = torchrun(2, "-m", "ringzero.cli", "train", *STRATEGIES[strategy], "--micro-batch", "4",
                    "--steps", str(steps), "--quiet", "--json-report", report)
    return Part(f"train-{strategy}", "train", argv, TRAIN_S, report=report)


def bench_comm_part() -> Part:
    argv = (sys.executable, "-m", "ringzero.cli", "bench", "comm", "--nproc", "2", "--collective",
            "all_reduce,all_gather,reduce_scatter", "--sizes", "64KiB,4MiB", "--iters", "5", "--compare", "--json")
    return Part("bench-comm", "bench_comm", argv, BENCH_S)


def nccl_comm_part(devices: int, report: str) -> Part:
    world = min(2, devices)
    note = None if world == 2 else (f"{devices} CUDA device: NCCL refuses two ranks on one GPU, so "
                                    "1 rank (no message between ranks)")
    argv = torchrun(world, "-m", "ringzero.gpu_check.nccl_comm", "--out", report)
    return Part("nccl-comm", "nccl_comm", argv, NCCL_S, report=report, note=note)


def plan(parts: tuple[str, ...], steps: int, tests: str, devices: int, workdir: str) -> list[Part]:
    """The parts named in `parts` (pytest, train, bench, nccl), in the check's order."""
    out: list[Part] = []
    if "pytest" in parts:
        out.append(pytest_part(tests))
    if "train" in parts:
        out += [train_part(s, steps, os.path.join(workdir, f"train-{s}.json")) for s in STRATEGIES]
    if "bench" in parts:
        out.append(bench_comm_part())
    if "nccl" in parts:
        out.append(nccl_comm_part(devices, os.path.join(workdir, "nccl-comm.json")))
    return out


def execute(part: Part) -> Finished:
    """Run `part`'s command to its end or its timeout; its output goes to files, not pipes, so that
    a grandchild that outlives it cannot keep the read open."""
    env = {**os.environ, **ENV}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(part.argv, stdout=out, stderr=err, env=env, cwd=part.cwd, start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=part.timeout_s), False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
        _stop_session(proc)
        wall = time.monotonic() - t0
        return Finished(rc, _read(out), _read(err), wall, timed_out)


def _stop_session(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop what is left of the part's session (its process group): a timed-out command gets
    SIGTERM and `grace_s` to stop its own children (torchrun's agent stops its ranks), then
    anything still there, a stray rank included, gets SIGKILL."""
    if proc.poll() is None:
        _signal(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):    # the session is already empty
        pass


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")
