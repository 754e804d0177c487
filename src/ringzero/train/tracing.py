"""The traced steps of one rank: what `ringzero train --trace DIR` and `--profile DIR` record.

Over the steps `run.trace_options.steps` names, the tracer keeps one `comm.timeline.Timeline` and
one `comm.TrafficMeter` open (so everything in between is seen: the steps, and the validation,
probes and checkpoint saves after them), and anchors this rank's clock to the grid's first rank
before and after them (`comm.clock`). Then the traced ranks meet (`comm.clock.meet`), so that the
first traced step starts together on every rank: what the tracer started (the anchor's exchanges,
the profiler) takes each rank its own time, and a rank let into the step early would wait for its
peers inside it. What it collected leaves the rank as plain data (`RankResult.trace`);
`ringzero.trace` turns it into Chrome trace-event files. Steps are named as the progress line
numbers them: loop index s is "step s+1".

With `profile`, torch.profiler runs over the same steps (CPU activities; CUDA where present) on
every thread of the process (`profile_all_threads`: by default it sees only the thread that
started it, and the data-parallel collectives run on the communication thread,
`parallel.comm_queue`), and every phase and collective is a `record_function` range in it named
`ringzero:<name>`; torch writes its own per-rank trace with `tensorboard_trace_handler`, which
TensorBoard and Holistic Trace Analysis read.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import clock, timeline
from ringzero.parallel.topology import Topology
from ringzero.run import trace_options
from ringzero.run.config import TrainConfig
from ringzero.train import kineto_notices

SCHEMA = 1
"""The version of the plain data a tracer hands over (and of the trace files written from it)."""


@dataclasses.dataclass(frozen=True)
class Seat:
    """Where a traced rank sits: its rank and the traced ranks' count, the group their clocks are
    anchored over (`members` of it only: a parameter server's workers, whose group holds the
    servers too) and the process groups its trace lists."""
    rank: int
    world: int
    group: object = None
    groups: tuple = ()
    members: list[int] | None = None

    @classmethod
    def of_grid(cls, topo: Topology) -> "Seat":
        return cls(topo.rank, topo.world, topo.grid_group if topo.world > 1 else None, tuple(_groups(topo)))


class Tracer:
    """Call `begin(step)` before each step and `end(step, phases, start, stop)` once everything after
    it (validation, saves) is done; `data` is what was traced, once the last traced step ended."""

    def __init__(self, cfg: TrainConfig, seat: Seat, first: int) -> None:
        self.cfg, self.seat = cfg, seat
        self.steps = trace_options.steps(cfg, first)
        self.data: dict | None = None
        self._log: timeline.Timeline | None = None
        self._meter: comm.TrafficMeter | None = None
        self._profiler = None
        self._records: list[dict] = []
        self._anchors: dict = {}

    def begin(self, step: int) -> None:
        if not self.steps or step != self.steps.start:
            return
        self._anchors["start"] = self._anchor()
        if self.cfg.trace.profile is not None:
            self._start_profiler()
        self._meter = comm.TrafficMeter().__enter__()
        self._log = timeline.Timeline().__enter__()
        if self.seat.world > 1:
            clock.meet(self.seat.group, self.seat.members)

    def end(self, step: int, phases: dict[str, float], start: float, stop: float) -> None:
        """Step `step` (the loop's index; which ran from `start` to `stop`, `time.time()`) is over,
        with `phases` (the engine's seconds per phase)."""
        if step not in self.steps:
            return
        self._records.append({"step": step + 1, "start": start, "end": stop, "phases": dict(phases)})
        timeline.record(f"step {step + 1}", "step", start, stop, step=step + 1)
        if step == self.steps[-1]:
            self._finish()

    def _finish(self) -> None:
        self._log.__exit__(None, None, None)
        self._meter.__exit__(None, None, None)
        if self._profiler is not None:
            timeline.AROUND.remove(_profiled)
            with kineto_notices.quiet():
                self._profiler.stop()
        self._anchors["end"] = self._anchor()
        log = self._log
        self.data = {
            "schema": SCHEMA, "rank": self.seat.rank, "world": self.seat.world,
            "global_rank": dist.get_rank() if dist.is_initialized() else 0,
            "backend": dist.get_backend(self.seat.group) if dist.is_initialized() else "none",
            "groups": list(self.seat.groups), "steps": self._records, "clock": self._anchors,
            "spans": [dataclasses.asdict(s) for s in log.spans],
            "calls": [_call(c) for c in log.calls], "p2p": [_call(c) for c in log.p2p],
            "meter": self._meter.summary(), "blocked": log.blocked,
            "trace_dir": self.cfg.trace.trace, "profile_dir": self.cfg.trace.profile, "config": self.cfg.as_dict(),
        }

    def _anchor(self) -> dict:
        """{"at": this rank's clock, "offsets": every traced rank's (`comm.clock.offsets`)}."""
        seat = self.seat
        offsets = clock.offsets(seat.group, seat.members) if seat.world > 1 else [{"offset_s": 0.0, "error_s": 0.0}]
        return {"at": time.time(), "offsets": offsets}

    def _start_profiler(self) -> None:
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        os.makedirs(self.cfg.trace.profile, exist_ok=True)
        try:
            every_thread = _ExperimentalConfig(profile_all_threads=True)
        except TypeError:       # an older torch's profiler has no such option
            every_thread = None
            warnings.warn(f"--profile: torch {torch.__version__}'s profiler records only the main thread; the "
                          f"collectives of the communication thread are missing from its trace (--trace has them)")
        self._profiler = profile(activities=activities, record_shapes=False, experimental_config=every_thread,
                                 on_trace_ready=tensorboard_trace_handler(self.cfg.trace.profile,
                                                                          worker_name=f"rank{self.seat.rank}"))
        with kineto_notices.quiet():
            self._profiler.start()
        timeline.AROUND.append(_profiled)


def _profiled(name: str):
    """A profiler range for ringzero's span or collective `name`, prefixed so it stands apart from
    torch's own (`aten::...`)."""
    return torch.profiler.record_function(f"ringzero:{name}")


def _groups(topo: Topology) -> list[dict]:
    """Every process group of the grid: {"name" (its dimensions), "pg_name", "ranks" (global)}."""
    if not dist.is_initialized():
        return []
    out = []
    for dims, pg in sorted(topo.groups.items()):
        ranks = dist.get_process_group_ranks(pg) if pg is not None else list(range(dist.get_world_size()))
        name = getattr(pg if pg is not None else dist.group.WORLD, "group_name", "")
        out.append({"name": "x".join(dims), "pg_name": str(name), "ranks": list(ranks)})
    return out


def _call(c: timeline.CallRecord) -> dict:
    out = dataclasses.asdict(c)
    out["ranks"] = list(c.ranks)
    return out
