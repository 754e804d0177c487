"""The swap loop's time model with cores shared by the I/O and the update (`plan.strategies.swap_pipeline`),
and the probe that measures how much they slow each other down."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.parallel.offload.config import OffloadConfig
from ringzero.parallel.offload.optimizer import NvmeOffloadAdam
from ringzero.parallel.optimizer import AdamConfig
from ringzero.plan.strategies.swap_pipeline import io_queue, swap_seconds
from ringzero.train.offload_probe import interference, measure

times = st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]), min_size=0, max_size=8)


def _recurrence(read_s, compute_s, write_s, b):
    """The closed recurrence of the loop without interference, written independently."""
    n = len(compute_s)
    io = done = 0.0
    read_end = [0.0] * n
    for j in range(min(b, n)):
        io += read_s[j]
        read_end[j] = io
    for i in range(n):
        done = max(done, read_end[i]) + compute_s[i]
        io = max(io, done) + write_s[i]
        if i + b < n:
            io += read_s[i + b]
            read_end[i + b] = io
    return max(io, done)


@settings(max_examples=300, deadline=None)
@given(times, st.data(), st.integers(1, 5))
def test_without_interference_the_simulation_is_the_recurrence(compute, data, b):
    n = len(compute)
    read = data.draw(st.lists(st.sampled_from([0.0, 0.25, 1.0, 3.0]), min_size=n, max_size=n))
    write = data.draw(st.lists(st.sampled_from([0.0, 0.25, 1.0, 3.0]), min_size=n, max_size=n))
    assert swap_seconds(read, compute, write, b) == pytest.approx(_recurrence(read, compute, write, b))


@settings(max_examples=200, deadline=None)
@given(times, st.integers(1, 4), st.floats(1.0, 3.0), st.floats(1.0, 3.0))
def test_interference_costs_time_but_never_more_than_running_everything_slowed(compute, b, s_io, s_up):
    n = len(compute)
    read, write = [1.0] * n, [0.5] * n
    free = swap_seconds(read, compute, write, b)
    shared = swap_seconds(read, compute, write, b, s_io, s_up)
    slowed = swap_seconds([r * s_io for r in read], [c * s_up for c in compute], [w * s_io for w in write], b)
    assert free - 1e-9 <= shared <= slowed + 1e-9
    # the serial loop (nothing overlapped, so nothing slowed) bounds it too while overlapping still
    # gets more done per second than taking turns (1/s_io + 1/s_up >= 1; measured here: ~1.1)
    if 1 / s_io + 1 / s_up >= 1:
        assert shared <= sum(read) + sum(compute) + sum(write) + 1e-9


def test_interference_by_hand():
    # one chunk: read, update, write in turn, never together: no slowdown applies
    assert swap_seconds([1.0], [2.0], [1.0], 2, 2.0, 2.0) == pytest.approx(4.0)
    # two chunks, 2 buffers: R0 R1 | U0 runs beside R1 (both slowed 2x from t=1)...
    # R0 [0,1]; R1 and U0 together from 1: R1 (1 s of work) at half speed ends at 3, U0 (1 s) at 3;
    # then W0 [3,4] beside U1 [3,5] at half speed: W0 (1) ends 5, U1 (1) ends 5; W1 [5,6].
    assert swap_seconds([1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 2, 2.0, 2.0) == pytest.approx(6.0)
    assert swap_seconds([1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 2) == pytest.approx(4.0)
    assert io_queue(3, 2) == [("read", 0), ("read", 1), ("write", 0), ("read", 2), ("write", 1), ("write", 2)]
    with pytest.raises(ValueError, match="slowdowns > 0"):
        swap_seconds([1.0], [1.0], [1.0], 1, 0.0)


def test_probe_measures_both_slowdowns_on_the_optimizers_own_file(tmp_path):
    import torch
    cfg = OffloadConfig(device="nvme", nvme_path=str(tmp_path), buffer_numel=1 << 16, buffer_count=2)
    opt = NvmeOffloadAdam([torch.randn(300_000)], AdamConfig(), cfg, None, None, 0)
    try:
        alone = opt.probe_disk()
        slow = interference(opt, alone)
        assert set(slow) == {"io_slowdown", "update_slowdown"} and all(v > 0 for v in slow.values())
        rates = measure(opt)
        assert {"copy_bps", "read_bps", "write_bps", "io_slowdown", "update_slowdown"} <= set(rates)
        loaded = opt.probe_disk(None, lambda: None)
        assert loaded["load_s"] >= 0 and loaded["read_gbps"] > 0
    finally:
        opt.close()
