"""What other tools read of a traced run: torch.profiler's own trace (`--profile`) holds every
collective of the traced steps, the communication thread's included, and ringzero's phases as
`ringzero:` ranges; Holistic Trace Analysis, pointed at the trace's rank folder, reads each rank
as itself (a merged file among them would be read as rank 0); and the trace, the progress line and
`--trace-steps` number the steps alike."""

import collections
import json
import math

import pytest

from ringzero.commands.train_log import StepCallback
from ringzero.run.config import TrainConfig
from ringzero.trace.write import RANKS, write_traces
from ringzero.train.rank import train_rank

CFG = dict(model="nano", seq=16, micro_batch=1, steps=4, max_bytes=65536, eval_every=1000, eval_batches=1,
           strategy="zero2", trace_steps="2:3")
PHASES = ("forward", "backward", "comm", "optimizer")


def _traced(group, cfg):
    lines, shown = [], StepCallback(cfg, 2, show=False)
    r = train_rank(cfg, group=group, calibrate=False,
                   progress=lambda step, res: lines.append(shown.line(step, res, None, 0.0)))
    return {"trace": r.trace, "lines": lines}


_RUN: dict = {}


def _run(pool, tmp_path_factory):
    if not _RUN:
        d = tmp_path_factory.mktemp("tools")
        cfg = TrainConfig(**CFG, trace=str(d / "trace"), profile=str(d / "profile"))
        results = pool.run(_traced, cfg, world=2)
        write_traces(str(d / "trace"), [r["trace"] for r in results])
        _RUN.update(folder=d, results=results)
    return _RUN


def _profile(folder, rank: int) -> list[dict]:
    (path,) = (folder / "profile").glob(f"rank{rank}.*.pt.trace.json")
    return json.loads(path.read_text())["traceEvents"]


@pytest.mark.timeout(240)
def test_the_profile_holds_every_collective_on_its_thread_and_the_prefixed_phases(pool, tmp_path_factory):
    run = _run(pool, tmp_path_factory)
    for rank, r in enumerate(run["results"]):
        ranges = [e for e in _profile(run["folder"], rank) if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
        names = collections.Counter(e["name"] for e in ranges)
        assert not set(names) & set(PHASES), names          # every ringzero range is prefixed
        assert {f"ringzero:{p}" for p in PHASES} <= set(names), names
        calls = r["trace"]["calls"]
        ringzero = collections.Counter(f"ringzero:{c['collective']}" for c in calls)
        assert ringzero and {k: names[k] for k in ringzero} == ringzero, (names, ringzero)
        comm_thread = {e["tid"] for e in ranges if e["name"] == "ringzero:reduce_scatter_tensor"}
        main_thread = {e["tid"] for e in ranges if e["name"] == "ringzero:forward"}
        assert comm_thread and not comm_thread & main_thread     # the buckets' reductions, beside backward


@pytest.mark.timeout(240)
def test_hta_reads_the_rank_folder_each_rank_as_itself(pool, tmp_path_factory):
    from hta.trace_analysis import TraceAnalysis
    run = _run(pool, tmp_path_factory)
    ranks = run["folder"] / "trace" / RANKS
    assert sorted(p.name for p in ranks.iterdir()) == ["rank0.json", "rank1.json"]
    hta = TraceAnalysis(trace_dir=str(ranks))
    assert sorted(hta.t.get_ranks()) == [0, 1]
    for rank in (0, 1):
        assert set(hta.t.get_trace(rank)["pid"]) == {rank}
    # what docs/tracing.md says of HTA's breakdowns on a trace without GPU kernels
    overlap = hta.get_comm_comp_overlap(visualize=False)
    assert all(math.isnan(v) for v in overlap["comp_comm_overlap_pctg"])
    assert all(len(frame) == 0 for frame in hta.get_gpu_kernel_breakdown(visualize=False))


@pytest.mark.timeout(240)
def test_the_trace_names_its_steps_as_the_progress_line_and_trace_steps_count_them(pool, tmp_path_factory):
    run = _run(pool, tmp_path_factory)
    merged = json.loads((run["folder"] / "trace" / "merged.json").read_text())
    for rank, r in enumerate(run["results"]):
        named = sorted(e["name"] for e in merged["traceEvents"] if e.get("cat") == "step" and e["pid"] == rank)
        assert named == ["step 2", "step 3"]                          # --trace-steps 2:3, both included
        assert [s["step"] for s in r["trace"]["steps"]] == [2, 3]
        # the progress line after the 2nd and the 3rd step the run took
        assert [line.split("/")[0] for line in r["lines"][1:3]] == named == ["step 2", "step 3"]


def test_kinetos_notices_stay_off_the_terminal_and_other_lines_do_not(capfd):
    """torch.profiler's start and stop print Kineto's USDT/STAGE notices on fd 2 at any log level:
    they are dropped, while a line of any other kind written meanwhile comes through."""
    import os

    import torch

    from ringzero.train import kineto_notices
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with kineto_notices.quiet():
        prof.start()
        os.write(2, b"a real warning\n")
    torch.ones(4).sum()
    with kineto_notices.quiet():
        prof.stop()
    err = capfd.readouterr().err
    assert "USDT:" not in err and "STAGE:" not in err, err
    assert "a real warning" in err
