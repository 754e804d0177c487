"""Pipeline parallelism inside the trainer: parity with one rank for every schedule, 3D parallelism,
the twins (boundary bytes, traffic, model states, micro-batches and activations held per stage,
the order of every stage's actions under synthetic costs), and bad input.

A pipeline of p stages runs the same micro-batches as one rank accumulating them, so its losses and
final parameters (every stage's, the tied embedding's two copies included) must equal the single
rank's within fp32 rounding (1e-5 relative) whatever the schedule. Every test has a timeout far below
the suite's: a schedule that deadlocked would fail here, not hang.
"""

import json

import pytest

from cli_errors import train_fails

from ringzero import cli
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.twin import predict
from ringzero.twin import report
from ringzero.twin import pipeline as pipe
from ringzero.run.config import FieldError, TrainConfig
from ringzero.train.rank import train_rank

BASE = dict(model="nano", layers=8, seq=16, steps=2, micro_batch=1, eval_every=100, eval_batches=1,
            max_bytes=1 << 16, clip=0.5, comm_algorithm="ring", lr=1e-2)
RTOL = 1e-5
ATOL_PARAMS = 2e-6
"""Adam normalises each step, so rounding in a near-zero gradient moves a weight by up to ~lr·1e-4."""


def _run(group, kw):
    r = train_rank(TrainConfig(**{**BASE, **kw}), keep_params=True, group=group, calibrate=False)
    params = {k.replace(".inner", ""): v for k, v in r.params.items()}
    return r.rank, r.losses, r.val, params, r


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * max(abs(b), 1e-3)


def _compare(label, out, ref, bad, val=True, params_ref=None):
    """Losses (and the validation loss, with `val`) against `ref`'s; each rank's parameters (its
    stage's) against `params_ref`'s (default `ref`'s), and the stages' together are all of them."""
    _, ref_losses, ref_val, ref_params, _ = ref
    ref_params = ref_params if params_ref is None else params_ref[3]
    held = {name for *_, params, _ in out for name in params}
    if held != set(ref_params):
        bad.append(f"{label}: the stages hold {sorted(held ^ set(ref_params))} differently from one rank")
    for rank, losses, got_val, params, _ in out:
        got = losses + ([v for _, v in got_val] if val else [])
        want = ref_losses + ([v for _, v in ref_val] if val else [])
        if len(got) != len(want) or not all(_close(a, b) for a, b in zip(got, want)):
            bad.append(f"{label} rank {rank}: losses {got} != {want}")
        for name, got_p in params.items():
            want_p = ref_params.get(name, [])
            close = all(abs(a - b) <= ATOL_PARAMS + RTOL * abs(b) for a, b in zip(got_p, want_p))
            if len(got_p) != len(want_p) or not close:
                bad.append(f"{label} rank {rank}: parameter {name} differs")
                break


def _cases():
    # The interleaved schedule with v = 1 is 1F1B's order (tests/test_plan_pipeline.py), so v = 2 here.
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        for p in (2, 3, 4):
            for m in sorted({1, p, 2 * p + 1}):     # fewer than p, exactly p, and more than 2p
                try:
                    pipeline.check(p, BASE["layers"], m, schedule, v)
                except ValueError:
                    continue
                yield dict(pp=p, grad_accum=m, schedule=schedule, virtual_stages=v)


@pytest.mark.timeout(400)
def test_every_schedule_equals_one_rank(pool):
    """GPipe, 1F1B and interleaved 1F1B (v = 1, 2) for p in {2, 3, 4} and m in {1, p, 2p+1}
    (those the schedule runs): losses, validation loss and every parameter equal one rank's."""
    cases = list(_cases())
    refs = {m: pool.run(_run, dict(grad_accum=m), world=1)[0] for m in {c["grad_accum"] for c in cases}}
    bad = []
    for kw in cases:
        _compare(kw, pool.run(_run, kw, world=kw["pp"]), refs[kw["grad_accum"]], bad)
    assert not bad, "\n".join(bad)


THREE_D = [  # (config, world); the reference is one rank over the same global batch
    (dict(dp=2, tp=2, pp=2, strategy="zero1", grad_accum=2), 8),
    (dict(dp=2, pp=2, strategy="zero1", grad_accum=4, schedule="interleaved", virtual_stages=2, recompute="full"), 4),
    (dict(tp=2, pp=2, grad_accum=3, schedule="gpipe", sequence_parallel=True), 4),
]


@pytest.mark.timeout(400)
def test_3d_parallelism_equals_one_rank_and_every_twin_is_exact(pool):
    """dp x tp x pp with ZeRO-1 over dp trains like one rank (its losses; its parameters equal the same
    dp x tp run's without a pipeline, since tensor parallelism alone rounds Adam's near-zero updates
    differently from one rank); per rank, bytes on the wire equal the
    planner's exactly, model states too (up to ZeRO's padding), each stage holds the micro-batches
    the schedule says at its peak (activation bytes within 10 %), and the point-to-point bytes over
    each stage boundary are 2·m·b·s·h·bytes/t."""
    bad = []
    for kw, world in THREE_D:
        cfg = TrainConfig(**{**BASE, **kw})
        dp = cfg.placement(world).dp
        ref = pool.run(_run, dict(grad_accum=cfg.training.grad_accum * dp), world=1)[0]
        flat = {k: v for k, v in kw.items() if k not in ("pp", "schedule", "virtual_stages")}
        same_grid = pool.run(_run, flat, world=world // cfg.parallel.pp)[0]
        out = pool.run(_run, kw, world=world)
        _compare(kw, out, ref, bad, val=dp == 1, params_ref=same_grid)
        results = [r for *_, r in out]
        for r in results:
            sent = sum(op["bytes_sent"] for op in r.traffic["ops"].values())
            twin = predict.traffic(cfg, world, r.buckets, r.rank, r.sp_elements)["bytes_sent"]
            if sent != twin:
                bad.append(f"{kw} rank {r.rank}: bytes sent {sent} != planner {twin}")
            for state, value in predict.states(cfg, world, r.rank).items():
                diff, pad = r.held[state] - value, len(r.buckets) * dp * (8 if state == "optimizer" else 4)
                if not 0 <= diff < pad:
                    bad.append(f"{kw} rank {r.rank}: {state} held {r.held[state]} vs planner {value:.0f}")
            stage = pipe.stage_of(cfg, world, r.rank)
            if r.inflight != pipe.inflight(cfg, stage):
                bad.append(f"{kw} stage {stage}: held {r.inflight} micro-batches, schedule says "
                           f"{pipe.inflight(cfg, stage)}")
            want = predict.activations(cfg, stage=stage)
            if abs(r.activations - want) > 0.1 * want:
                bad.append(f"{kw} stage {stage}: activations at peak {r.activations} vs planner {want:.0f}")
        rows = {t.name: t for t in report.pipeline_twins(cfg, world, results)}
        if rows["pipeline bytes sent per step (busiest stage)"].error != 0:
            bad.append(f"{kw}: {rows['pipeline bytes sent per step (busiest stage)']}")
        boundary = rows["pipeline bytes per stage boundary"]
        if boundary.measured != boundary.predicted or boundary.predicted != 2 * cfg.training.grad_accum * cfg.training.micro_batch * \
                cfg.shape.seq * cfg.shape.hidden * 4 // cfg.parallel.tp:
            bad.append(f"{kw}: boundary bytes measured {boundary.measured}, planner {boundary.predicted}")
    assert not bad, "\n".join(bad)


BUBBLE_CASES = [("gpipe", 2, 2, 1), ("1f1b", 2, 5, 1), ("1f1b", 3, 3, 1), ("gpipe", 3, 7, 1),
                ("1f1b", 4, 1, 1), ("1f1b", 4, 4, 1), ("interleaved", 2, 4, 2)]


def _timelines(group, kw):
    r = train_rank(TrainConfig(**{**BASE, "clip": None, **kw}), group=group, calibrate=False)
    return r.stage, r.timelines


COSTS = (0.005, 0.01)
"""Synthetic forward and backward seconds per stage: a stage sends a chunk's output only once its
cost has passed, whatever the machine is doing, so the order below holds under any load."""


@pytest.mark.timeout(300)
def test_every_stage_runs_the_planners_actions_in_their_order_and_waits_for_its_inputs(pool):
    """What the bubble stands on, without a clock's tolerance: each stage ran the planner's action
    list in its order every step (`plan.pipeline.schedule.actions`, the list `simulate` prices), and
    no action started before the action it takes its input from had spent its synthetic cost (the
    producer sends only after it). Played with these costs, that order idles the planner's bubble.
    The wall-clock idle fraction against the bubble is a benchmark: a busy core stretches compute,
    not the schedule (`benchmarks/bench_pipeline_bubble.py`)."""
    bad = []
    for schedule, p, m, v in BUBBLE_CASES:
        kw = dict(pp=p, grad_accum=m, schedule=schedule, virtual_stages=v, pipeline_cost=COSTS)
        timelines = [t for _, t in sorted(pool.run(_timelines, kw, world=p))]
        for step in range(len(timelines[0])):
            ran = [[pipeline.Action(*e[:3]) for e in t[step]] for t in timelines]
            if ran != [pipeline.actions(i, p, m, schedule, v) for i in range(p)]:
                bad.append(f"{schedule} p={p} m={m} v={v} step {step}: ran {ran}")
                continue
            started = {(e[0], e[1], e[2] * p + i): e[3] for i, t in enumerate(timelines) for e in t[step]}
            for i, t in enumerate(timelines):
                for kind, micro, chunk, start, _ in t[step]:
                    need = pipeline.input_of(pipeline.Action(kind, micro, chunk), i, p, v)
                    if need is not None and start < started[need] + COSTS[need[0] == "B"] / v:
                        bad.append(f"{schedule} p={p} stage {i} {kind}{micro}.{chunk} started before its input")
        predicted = pipe.bubble(TrainConfig(**{**BASE, **kw}))
        played = pipeline.idle_fraction(pipeline.simulate(p, m, schedule, v, *COSTS))
        if abs(played - predicted) > 1e-9:
            bad.append(f"{schedule} p={p} m={m} v={v}: the order idles {played:.4f}, the planner says {predicted:.4f}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("kw, match", [
    (dict(pp=2, grad_accum=3, schedule="interleaved"), "multiple of pp=2"),
    (dict(pp=3, layers=2), "more than the 2 layers"),
    (dict(pp=2, virtual_stages=2, grad_accum=2), "need the interleaved schedule"),
    (dict(pp=2, strategy="zero3"), "cannot run under pipeline parallelism"),
    (dict(pp=2, strategy="zero2"), "cannot run under pipeline parallelism"),
    (dict(schedule="zero-bubble"), "schedule 'zero-bubble' is not supported"),
    (dict(pipeline_cost=(0.1, 0.2)), "need pp > 1"),
])
def test_bad_pipeline_input_is_one_line(kw, match):
    with pytest.raises(FieldError, match=match):
        TrainConfig(**{**BASE, **kw})


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, words", [
    (["--nproc", "4", "--pp", "3"], ("pp=3 does not divide the 4 ranks",)),
    (["--nproc", "2", "--pp", "2", "--grad-accum", "3", "--schedule", "interleaved"], ("multiple of pp=2",)),
    (["--nproc", "2", "--pp", "2", "--strategy", "zero3"], ("zero3", "pipeline")),
    (["--nproc", "2", "--pipeline-plot", "x.png"], ("--pipeline-plot", "--pp > 1")),
    (["--nproc", "2", "--pp", "2", "--pipeline-cost", "fast"], ("--pipeline-cost",)),
    (["--nproc", "2", "--layout", "auto", "--tp", "2"], ("--layout auto chooses --tp",)),
])
def test_bad_pipeline_command_line_exits_2_before_any_rank(capsys, tmp_path, argv, words):
    train_fails(capsys, tmp_path, [*argv, "--steps", "2", "--seq", "16"], *words)


@pytest.mark.timeout(300)
def test_train_command_draws_the_schedule_and_reports_the_pipeline(capsys, tmp_path):
    """`ringzero train --pp 2 --pipeline-plot`: a PNG of the measured schedule, the JSON report's
    pipeline section with one timeline per stage, and the twins table with per-stage rows."""
    plot, out = tmp_path / "schedule.png", tmp_path / "report.json"
    code = cli.main(["train", "--nproc", "2", "--pp", "2", "--grad-accum", "4", "--steps", "3", "--seq", "16",
                     "--micro-batch", "1", "--max-bytes", "65536", "--layers", "4",
                     "--pipeline-plot", str(plot), "--json-report", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())
    timeline = data["pipeline"]["timeline"]
    assert len(timeline) == 2 and all(len(stage) == 2 * 4 for stage in timeline)
    assert data["twins"]["pipeline bytes per stage boundary"]["error"] == 0
    assert data["twins"]["stage 1: micro-batches held at peak"]["measured"] == 1
    assert "stage 0:" in text and "stage 1:" in text


def _stage_fails(group, kw):
    """Stage 1 raises in its second backward; the other stages are blocked in a receive from it."""
    import torch.distributed as dist

    import ringzero.train.pipeline_schedule as ps
    if dist.get_rank(group) == 1:
        calls = [0]
        real = ps.PipelineSchedule._backward

        def failing(self, *args):
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("stage 1 fails on purpose")
            return real(self, *args)
        ps.PipelineSchedule._backward = failing
    train_rank(TrainConfig(**{**BASE, **kw}), group=group, calibrate=False)


@pytest.mark.timeout(120)
def test_a_failing_stage_ends_the_pipeline_with_its_name():
    """A stage that raises mid-step while its neighbours wait on its messages: the job fails at
    once, naming that rank and its error (on fresh ranks: a pool would have to restart all eight;
    tests/test_launch.py shows that it does)."""
    from ringzero import launch
    with pytest.raises(launch.RankError, match="rank 1 failed.*stage 1 fails on purpose"):
        launch.spawn(_stage_fails, 3, (None, dict(pp=3, grad_accum=4)), timeout=60)


@pytest.mark.timeout(120)
def test_layout_auto_runs_and_prints_the_planners_layout(capsys):
    """`--layout auto` runs the layout `plan.search.recommend.engine_layout` picks, and says which."""
    from ringzero.commands.plan import DEFAULT_GPU
    from ringzero.plan.config import Training
    from ringzero.plan.hardware import hardware
    from ringzero.plan.search.recommend import engine_layout
    code = cli.main(["train", "--nproc", "2", "--layout", "auto", "--steps", "2", "--seq", "16", "--micro-batch", "1",
                     "--max-bytes", "65536", "--quiet"])
    out = capsys.readouterr().out
    par = engine_layout(TrainConfig(seq=16).shape, Training(micro_batch=1, global_batch=2), 2,
                        hardware(DEFAULT_GPU))
    assert code == 0, out
    assert f"layout auto: dp={par.dp} x tp={par.tp} x pp={par.pp}" in out, out
