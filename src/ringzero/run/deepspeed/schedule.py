"""DeepSpeed's learning-rate schedulers against ringzero's own: linear warm-up, then cosine decay
to lr/10 at the last step (GPT-3's, Brown et al. 2020 §B) or a constant lr (`optim_options.lr_at`).

Without a scheduler DeepSpeed runs the optimizer's lr from the first step to the last: no warm-up,
a constant lr (`no_scheduler`). A warm-up scheduler's `warmup_num_steps` becomes ringzero's warm-up
and WarmupLR/WarmupDecayLR's `warmup_max_lr` its peak lr (they set the lr themselves;
WarmupCosineLR scales the optimizer's); WarmupLR then holds the peak (constant), the others decay
(cosine). Where the shape differs (WarmupDecayLR decays linearly to 0, a log warm-up, a non-zero
start), one warning line says how. OneCycle and LRRangeTest are not mapped: one line says ringzero
uses its own schedule.
"""

from __future__ import annotations

import difflib

from ringzero.run.deepspeed.sections import Reader


WARMUPS = {"WarmupLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"),
           "WarmupDecayLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
                             "last_batch_iteration"),
           "WarmupCosineLR": ("warmup_min_ratio", "cos_min_ratio", "warmup_num_steps", "warmup_type", "total_num_steps",
                              "last_batch_iteration")}
"""DeepSpeed's warm-up schedulers and their parameters (deepspeed.runtime.lr_schedules)."""
OWN_SCHEDULE = ("OneCycle", "LRRangeTest")
DEFAULTS = {"warmup_num_steps": 1000, "warmup_max_lr": 1e-3, "warmup_min_lr": 0.0, "warmup_type": "log",
            "warmup_min_ratio": 0.0, "cos_min_ratio": 1e-4, "last_batch_iteration": -1}
"""DeepSpeed's values for the parameters a scheduler leaves out ("auto" takes ringzero's instead)."""
SCHEDULE = "linear warm-up over --warmup steps, then cosine decay to lr/10 at the last step"


def no_scheduler(r: Reader) -> None:
    """A config without a scheduler: DeepSpeed steps with the optimizer's lr unchanged."""
    r.put("warmup", 0, "the config's lack of a scheduler")
    r.put("lr_schedule", "constant", "the config's lack of a scheduler")


def scheduler(r: Reader, sched: dict) -> None:
    """Map a warm-up scheduler's steps (and peak lr); how its shape differs is said by
    `schedule_note` once the run's steps are known."""
    kind = sched.get("type")
    if kind in OWN_SCHEDULE:
        r.note(f"scheduler {kind} has no effect here: ringzero uses its own schedule ({SCHEDULE})")
        return
    if kind not in WARMUPS:
        close = difflib.get_close_matches(str(kind), [*WARMUPS, *OWN_SCHEDULE], n=1)
        raise ValueError(f"scheduler.type={kind!r}; allowed: {', '.join([*WARMUPS, *OWN_SCHEDULE])}"
                         + (f"; did you mean {close[0]}?" if close else ""))
    params = r.section(sched, "params", "scheduler.params")
    extra = [k for k in params if k not in WARMUPS[kind]]
    if extra:
        raise ValueError(f"scheduler.params.{extra[0]} is not a parameter of {kind}; its parameters: "
                         f"{', '.join(WARMUPS[kind])}")
    p = {}
    for k in WARMUPS[kind]:
        if k == "warmup_type":
            v = params.get(k, DEFAULTS[k])
            if v not in ("log", "linear") and not r.is_auto(v, f"scheduler.params.{k}"):
                raise ValueError(f"scheduler.params.warmup_type={v!r}; allowed: log, linear")
        else:
            kind_of = int if k in ("warmup_num_steps", "total_num_steps", "last_batch_iteration") else float
            v = r.number(params, k, kind_of, f"scheduler.params.{k}") if k in params else DEFAULTS.get(k)
        p[k] = v
    r.put("warmup", p["warmup_num_steps"], "scheduler.params.warmup_num_steps")
    r.put("lr_schedule", "constant" if kind == "WarmupLR" else "cosine", "scheduler.type")
    if kind != "WarmupCosineLR":                       # it sets the lr itself; the cosine one scales the optimizer's
        r.put("lr", p["warmup_max_lr"], "scheduler.params.warmup_max_lr")
    if kind != "WarmupLR" and "total_num_steps" not in params:
        raise ValueError(f"scheduler.params.total_num_steps is required by {kind} (the step its decay ends at)")
    r.later["scheduler"] = (kind, p)


def _after_warmup(kind: str, p: dict, steps: int, lr_schedule: str) -> str | None:
    """How the run's lr after the warm-up differs from `kind`'s (None: it does not)."""
    ratio, total = p.get("cos_min_ratio"), p.get("total_num_steps") or steps
    theirs = {"WarmupLR": "WarmupLR holds the peak",
              "WarmupDecayLR": f"WarmupDecayLR decays linearly to 0 at step {total}",
              "WarmupCosineLR": f"WarmupCosineLR decays to {ratio or 0.1:g} x lr at step {total}"}[kind]
    if lr_schedule == "constant":
        return None if kind == "WarmupLR" else f"after warm-up ringzero holds the lr, where {theirs}"
    if kind == "WarmupCosineLR" and ratio in (None, 0.1) and total == steps:
        return None
    return f"after warm-up ringzero decays by cosine to lr/10 at its last step ({steps}), where {theirs}"


def schedule_note(kind: str, p: dict, steps: int, lr_schedule: str) -> str | None:
    """How `kind` with parameters `p` differs from the run's schedule (`lr_schedule` over `steps`
    steps; None: it does not)."""
    diffs = []
    if p["warmup_type"] == "log":
        diffs.append("ringzero warms up linearly, not logarithmically")
    start = p.get("warmup_min_lr") or p.get("warmup_min_ratio")
    if start:
        diffs.append(f"ringzero's warm-up starts from 0, not from {start:g}{' x lr' if 'warmup_min_ratio' in p else ''}")
    end = _after_warmup(kind, p, steps, lr_schedule)
    if end:
        diffs.append(end)
    if p["last_batch_iteration"] not in (None, -1):
        diffs.append(f"ringzero's schedule starts at step 0 (or the resumed step), not at "
                     f"last_batch_iteration {p['last_batch_iteration']}")
    mapped = "warm-up steps are" if kind == "WarmupCosineLR" else "warm-up steps and peak lr are"
    return f"scheduler {kind}: its {mapped} mapped; {'; '.join(diffs)}" if diffs else None
