"""What a run writes to be seen afterwards: the timeline traces of some of its steps
(`trace`, `trace_steps`) and torch.profiler's own traces of the same steps (`profile`).

`trace_steps` is "A:B", the steps A to B, both included, numbered as the progress line numbers
them ("step 1/N" is the first) and as the trace names them ("step 1"); None traces the last
`DEFAULT_STEPS` steps (all of them when the run is shorter). `steps` resolves it against a run,
into the engine loop's 0-based indices; `check` refuses a window outside the run or reversed, in
one line, before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.run.fields import FieldError

DEFAULT_STEPS = 5


@dataclass(frozen=True, kw_only=True)
class TraceConfig:
    trace: str | None = None
    """A folder for the timeline traces: merged.json and ranks/rank<R>.json per rank (None: no trace)."""
    trace_steps: str | None = None
    """The traced steps, "A:B" (steps A to B, both included, numbered from 1 as the progress line
    numbers them; None: the last 5)."""
    profile: str | None = None
    """A folder for torch.profiler's per-rank traces of the same steps (None: no profiler)."""

    def __post_init__(self) -> None:
        for name in ("trace", "profile"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise FieldError(name, f"{name} needs a folder name, got {value!r}")
        if self.trace_steps is not None:
            if self.trace is None and self.profile is None:
                raise FieldError("trace_steps", "trace_steps chooses the steps --trace or --profile records: "
                                                "give --trace DIR or --profile DIR")
            parse(self.trace_steps)


def parse(text: str) -> tuple[int, int]:
    """"A:B" -> (A, B), or a one-line FieldError."""
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise FieldError("trace_steps", f"trace_steps {text!r}: give A:B, the steps A to B numbered from 1 "
                                        f"as the progress line numbers them, e.g. 10:14") from None
    if not 1 <= a <= b:
        raise FieldError("trace_steps", f"trace_steps {text!r} is empty or reversed: give A:B with 1 <= A <= B")
    return a, b


def steps(cfg, first: int = 0) -> range:
    """The engine loop's indices (0-based: index s is step s + 1) of the steps traced in a run of
    `cfg` that starts at index `first` (empty: nothing traced)."""
    t = cfg.trace
    if t.trace is None and t.profile is None:
        return range(0)
    end = cfg.training.steps
    if t.trace_steps is None:
        return range(max(first, end - DEFAULT_STEPS), end)
    a, b = parse(t.trace_steps)
    return range(a - 1, b)


def check(cfg, first: int = 0) -> None:
    """Raise a `FieldError` when the traced steps are not all steps the run takes."""
    t = cfg.trace
    if t.trace_steps is None:
        return
    a, b = parse(t.trace_steps)
    end = cfg.training.steps
    if a <= first or b > end:
        resumed = f" (it resumes from the checkpoint of step {first})" if first else ""
        raise FieldError("trace_steps", f"trace_steps {t.trace_steps!r} is outside the steps this run takes{resumed}; "
                                        f"allowed: A:B with {first + 1} <= A <= B <= {end} (steps numbered from 1)")
