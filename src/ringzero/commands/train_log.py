"""What a rank does after each training step: tell the launcher's watchdog, and on rank 0 show it.

On a terminal rank 0 draws a progress bar (rich: step, loss, validation loss, tokens/s, ETA).
When standard output is not a terminal (a log file, CI, `make run | tee`), a bar would only show its
final state, so rank 0 prints a plain line every `log_every` steps instead, as DeepSpeed's
`steps_per_print` does: step, loss, validation loss, learning rate, tokens/s, and under fp16 the
loss scale and the steps skipped for overflow.
"""

from __future__ import annotations

import math
import sys
import time

from ringzero.run.config import TrainConfig
from ringzero.run.ps_options import workers
from ringzero.watchdog import beacon


def log_every(cfg: TrainConfig) -> int:
    """Steps between log lines: the configured value, else a tenth of the run."""
    return cfg.training.log_every or max(1, cfg.training.steps // 10)


class StepCallback:
    """Called by the engine as `callback(step, result)` after every step, on every rank."""

    def __init__(self, cfg: TrainConfig, world: int, show: bool) -> None:
        self.cfg, self.t0 = cfg, time.perf_counter()
        self.first: int | None = None
        """The first step this run ran (a resumed run's checkpoint step): tokens/s counts from it."""
        self.tokens = cfg.global_batch(workers(cfg, world)) * cfg.shape.seq   # a ps run's servers take no batch
        self.bar = _Bar(cfg) if show and sys.stdout.isatty() else None
        self.every = log_every(cfg) if show and (self.bar is None or cfg.training.log_every) else None

    def __call__(self, step: int, res) -> None:
        beacon().step_done(step + 1)
        if step + 1 == self.cfg.training.steps:
            beacon().finished()          # what follows (evaluation, the report) is not a step
        if self.bar is None and self.every is None:
            return
        if self.first is None:
            self.first = step
        rate = self.tokens * (step + 1 - self.first) / (time.perf_counter() - self.t0)
        val = f"{res.val[-1][1]:.3f}" if res.val and res.val[-1][0] == step + 1 else None
        if self.bar is not None:
            self.bar.update(step, res.losses[-1], val, rate)
        if self.every is not None and ((step + 1) % self.every == 0 or step == 0 or step + 1 == self.cfg.training.steps):
            print(self.line(step, res, val, rate), flush=True)

    def line(self, step: int, res, val: str | None, rate: float) -> str:
        parts = [f"step {step + 1}/{self.cfg.training.steps}", f"loss {res.losses[-1]:.4f}"]
        if val is not None:
            parts.append(f"val {val}")
        parts += [f"lr {self.cfg.lr_at(step):.2e}", f"{rate:,.0f} tokens/s"]
        if self.cfg.optim.precision == "fp16":
            scale = getattr(res, "loss_scale", None)
            if scale is not None:
                parts.append(f"loss scale {scale:g}")
            parts.append(f"skipped {getattr(res, 'skipped', 0)}")
        return "  ".join(parts)

    def close(self) -> None:
        beacon().finished()
        if self.bar is not None:
            self.bar.close()


class _Bar:
    """Rank 0's bar on a terminal (rich)."""

    def __init__(self, cfg: TrainConfig) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                            TextColumn("loss {task.fields[loss]:.3f}  val {task.fields[val]}  "
                                       "{task.fields[rate]:,.0f} tokens/s"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=cfg.training.steps, loss=math.nan, val="-", rate=0.0)
        self.bar.start()

    def update(self, step: int, loss: float, val: str | None, rate: float) -> None:
        fields = {"val": val} if val is not None else {}
        self.bar.update(self.task, completed=step + 1, loss=loss, rate=rate, **fields)

    def close(self) -> None:
        self.bar.stop()


def saves(results: list, console) -> None:
    """One line on the checkpoints: what they cost the step (the busiest rank) and took to write."""
    import statistics
    saves = [r.checkpoint for r in results if r.checkpoint]
    if not saves or not saves[0]["saves"]:
        return
    blocked = max(statistics.median(s["blocked_s"]) for s in saves)
    wrote = max(statistics.median(s["write_s"]) for s in saves)
    how = "asynchronous: the copy to host memory" if saves[0]["async"] else "synchronous"
    console.print(f"checkpoints: {saves[0]['saves']} saved; each blocked the step {blocked * 1e3:.1f} ms ({how}), "
                  f"writing took {wrote * 1e3:.1f} ms (medians, busiest rank)")
