"""The fault trials of `benchmarks/bench_faults.py`, one of each (`make bench` runs 20): a rank
killed with SIGKILL at a random moment ends the job with exit 1 within 60 s naming it, and a job
killed while it saves every step leaves a complete checkpoint that --resume takes and loads."""

from __future__ import annotations

import importlib.util
import os
import random

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_faults", os.path.join(HERE, "..", "benchmarks", "bench_faults.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(180)
@pytest.mark.parametrize("trial", ["rank_death", "save_death"])
def test_one_fault_trial(trial):
    ok, what = getattr(_bench(), trial)(2, random.Random(7))
    assert ok, what
