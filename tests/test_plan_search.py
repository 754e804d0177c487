"""`ringzero.plan.search.space`: what it enumerates, that everything it returns fits and is ranked, that
its fast path gives `estimate()`'s numbers exactly, and its errors. Pure Python, no timing asserts."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.plan.config import Parallel, Training
from ringzero.plan.estimate import estimate, to_dict
from ringzero.plan.hardware import Hardware, hardware
from ringzero.plan.model.presets import model
from ringzero.plan.search.space import TIE_RTOL, Space, _configurations, _evaluate, label, search
from ringzero.plan.model.shapes import ModelShape

SMALL = Space(micro_batches=(1, 2, 4), offload=("none", "cpu", "nvme"), schedules=("1f1b", "gpipe"))


def gpu(hbm_gb: float, gpus_per_node: int = 8) -> Hardware:
    return dataclasses.replace(hardware("a100-80gb"), name="test", hbm_bytes=int(hbm_gb * 1e9),
                               gpus_per_node=gpus_per_node)


@st.composite
def models(draw):
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, heads) if heads % k == 0]))
    return ModelShape(layers=draw(st.integers(1, 24)), hidden=heads * draw(st.integers(1, 64)), heads=heads,
                      kv_heads=kv, vocab=draw(st.integers(2, 5000)), seq=draw(st.sampled_from([16, 64, 256])),
                      gated=draw(st.booleans()), bias=draw(st.booleans()), tied=draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(models(), st.integers(1, 48), st.sampled_from([1, 2, 4, 8]), st.floats(0.001, 2.0),
       st.integers(1, 8), st.sampled_from([None, 48, 96]))
def test_every_result_fits_and_is_a_valid_split(m, gpus, per_node, hbm_gb, top, global_batch):
    hw = gpu(hbm_gb, per_node)
    r = search(m, Training(global_batch=global_batch), hw, gpus, space=SMALL, top=top)
    assert len(r.best) == min(top, r.fitting) and r.fitting <= r.evaluated
    steps = [e.time.step for e in r.best]
    # fastest first; steps within TIE_RTOL are a tie, ranked by memory instead
    assert all(b >= a * (1 - TIE_RTOL) for a, b in zip(steps, steps[1:]))
    for e in r.best:
        p = e.parallel
        assert e.fits and e.memory.total <= hw.hbm_bytes
        assert p.dp * p.tp * p.pp == gpus
        assert m.heads % p.tp == 0 and m.kv % p.tp == 0 and p.tp <= per_node
        assert m.layers % p.pp == 0
        assert e.training.global_batch == r.global_batch          # same tokens per step, comparable
    assert r.why() and all(isinstance(s, str) and s for s in r.why())


def test_global_batch_defaults_to_gpus_times_the_smallest_micro_batch():
    m, hw = model("gpt2"), hardware("a100-80gb")
    assert search(m, Training(micro_batch=7), hw, 8).global_batch == 8
    r = search(m, Training(), hw, 8, space=Space(micro_batches=(4, 2)))
    assert r.global_batch == 16 and {e.training.global_batch for e in r.best} == {16}
    r = search(m, Training(global_batch=32), hw, 8)
    assert r.global_batch == 32 and all(e.tokens_per_step == 32 * m.seq for e in r.best)


def _brute_force(m, tr, hw, gpus, space):
    """Every configuration by itertools.product and Parallel's own validation (independent of search)."""
    out = []
    for dp, tp, pp, zero, off, mb, rc, sp, sched in itertools.product(
            range(1, gpus + 1), range(1, gpus + 1), range(1, gpus + 1), space.zero, space.offload,
            space.micro_batches, space.recompute, space.sequence_parallel, space.schedules):
        if dp * tp * pp != gpus or m.heads % tp or m.kv % tp or tp > hw.gpus_per_node or m.layers % pp:
            continue
        if pp == 1 and sched != space.schedules[0]:
            continue                                # the schedule only matters with a pipeline
        try:
            par = Parallel(dp=dp, tp=tp, pp=pp, zero=zero, offload=off, sequence_parallel=sp,
                           schedule=sched, recompute=rc)
            t = dataclasses.replace(tr, micro_batch=mb)
            out.append(estimate(m, t, par, hw))
        except ValueError:
            continue
    return out


@pytest.mark.parametrize("name, gpus, hbm_gb", [("gpt2", 8, 3.0), ("nano", 12, 0.05), ("gpt2-medium", 16, 6.0)])
def test_search_is_exhaustive_and_ranks_by_step_time(name, gpus, hbm_gb):
    m, hw = model(name), gpu(hbm_gb)
    tr = Training(global_batch=4 * gpus)
    every = _brute_force(m, tr, hw, gpus, SMALL)
    fitting = sorted((e for e in every if e.fits), key=lambda e: e.time.step)
    r = search(m, tr, hw, gpus, space=SMALL, top=5)
    assert r.evaluated == len(every) and r.fitting == len(fitting) > 0
    assert [e.time.step for e in r.best] == [e.time.step for e in fitting[:5]]


@pytest.mark.parametrize("name, hw, gpus", [("gpt2", gpu(3.0), 16), ("llama-2-7b", hardware("a100-40gb"), 8),
                                            ("llama-2-13b", hardware("a100-80gb"), 32)])
def test_fast_path_equals_estimate_exactly(name, hw, gpus):
    m = model(name)
    tr = Training(global_batch=4 * gpus)
    seen = fits = 0
    for t, par in _configurations(m, tr, hw, gpus, SMALL):
        mem, st_ = _evaluate(m, t, par, hw)
        e = estimate(m, t, par, hw)
        assert mem == e.memory and mem.total == e.memory.total
        if e.fits:
            assert st_ is not None and st_.step == e.time.step and st_ == e.time
            fits += 1
        else:
            assert st_ is None
        seen += 1
    assert seen > 100 and 0 < fits < seen


def test_best_are_real_estimates():
    m, hw = model("llama-2-7b"), hardware("a100-80gb")
    r = search(m, Training(), hw, 16, top=3)
    for e in r.best:
        assert to_dict(e) == to_dict(estimate(m, e.training, e.parallel, hw))
    assert r.rate == r.evaluated / r.seconds


def test_why_explains_the_70b_winner_with_the_estimates_numbers():
    m, hw = model("llama-2-70b"), hardware("a100-80gb")
    r = search(m, Training(), hw, 1024, top=3)
    b = r.best[0]
    why = r.why()
    assert label(b) in why[0] and f"{b.memory.total / 1e9:.1f} GB" in why[0]
    assert label(r.best[1]) in why[1]
    for n in r.neighbours():
        assert any(f"{n.memory.total / 1e9:.1f} GB" in s for s in why)
    if b.parallel.tp > 1:
        assert any(s.startswith(f"tp={b.parallel.tp} keeps") for s in why)
    base = r.baseline()
    assert base is not None and base.parallel == Parallel(dp=1024) and not base.fits
    assert any("Plain data parallelism" in s and f"{base.memory.total / 1e9:.1f} GB" in s for s in why)


def test_nothing_fits_gives_an_empty_result_that_says_so():
    r = search(model("llama-2-70b"), Training(), gpu(1.0), 8)
    assert r.best == [] and r.fitting == 0 and r.evaluated > 0
    assert r.closest is not None and not r.closest.fits
    (why,) = r.why()
    assert why.startswith("Nothing fits") and label(r.closest) in why


def test_no_valid_split_gives_an_empty_result_that_says_so():
    m = ModelShape(layers=3, hidden=9, heads=3, vocab=10, seq=8)      # tp | 3 and pp | 3: only dp=2
    r = search(m, Training(global_batch=3), hardware("a100-80gb"), 2)     # 3 % (mb x 2) != 0
    assert r.best == [] and r.evaluated == 0 and r.closest is None
    assert r.why()[0].startswith("No configuration to evaluate on 2 GPUs")


def test_max_tp_and_space_restrict_the_enumeration():
    m, hw = model("gpt2"), hardware("a100-80gb")
    r = search(m, Training(), hw, 8, space=Space(max_tp=2, zero=(1,), recompute=("full",)), top=100)
    assert r.best and all(e.parallel.tp <= 2 and e.parallel.zero == 1 and e.parallel.recompute == "full"
                          for e in r.best)
    r = search(m, Training(), hw, 8, space=Space(offload=("cpu",)), top=100)
    assert r.best and all(e.parallel.offload == "cpu" and e.parallel.zero >= 1 for e in r.best)


@pytest.mark.parametrize("kw, field", [
    (dict(zero=(4,)), "zero"), (dict(zero=()), "zero"), (dict(zero="0123"), "zero"),
    (dict(micro_batches=(0,)), "micro_batches"), (dict(micro_batches=(1.5,)), "micro_batches"),
    (dict(recompute=("partial",)), "recompute"), (dict(sequence_parallel=(1,)), "sequence_parallel"),
    (dict(offload=("disk",)), "offload"), (dict(schedules=("zero-bubble",)), "schedules"),
    (dict(virtual_stages=0), "virtual_stages"), (dict(max_tp=0), "max_tp"), (dict(max_tp=2.0), "max_tp"),
])
def test_bad_space_values_raise_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field) as err:
        Space(**kw)
    assert "\n" not in str(err.value)


def test_space_accepts_lists_and_drops_duplicates():
    s = Space(zero=[3, 1, 3], micro_batches=[2, 2])
    assert s.zero == (3, 1) and s.micro_batches == (2,)


@pytest.mark.parametrize("gpus, top", [(0, 1), (8, 0)])
def test_bad_arguments_raise(gpus, top):
    with pytest.raises(ValueError):
        search(model("gpt2"), Training(), hardware("a100-80gb"), gpus, top=top)


def test_ties_in_step_time_go_to_the_layout_with_less_memory():
    """Sequence parallelism moves the same bytes as its all-reduce and splits the norms and dropouts
    over tp (Korthikanti et al. 2022 §4.2.2): never slower, less memory, so it ranks first; any tie
    goes to the layout with less memory."""
    r = search(model("llama-2-7b"), Training(dropout=True), hardware("a100-80gb"), 8, top=12)
    for a, b in zip(r.best, r.best[1:]):
        if b.time.step <= a.time.step * (1 + TIE_RTOL):
            assert a.memory.total <= b.memory.total, (label(a), label(b))
    assert r.best[0].parallel.sequence_parallel
