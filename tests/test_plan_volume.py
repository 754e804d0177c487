"""The planner's traffic formulas: the published closed forms, and properties over every algorithm.

Pure Python (no ranks): the meter tests check these same functions against real traffic.
"""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ringzero.plan.comm.chunks import chunk_sizes
from ringzero.plan.comm.algorithms import fits
from ringzero.plan.comm.volume import MODULES, call_for, volume, volumes

GB = 10**9


def test_ring_all_reduce_sends_2_n_minus_1_over_n_S():
    """Patarasuk & Yuan 2009: C_ring = 2(N-1)/N·Φ per GPU, exactly when S divides by N."""
    for n in (2, 3, 4, 8, 16):
        count = 1024 * n
        for v in volumes(call_for("all_reduce", "ring", n, count, 4)):
            assert v.bytes_sent == v.bytes_recv == 2 * (n - 1) * count * 4 // n
            assert v.rounds == 2 * (n - 1)


def test_ring_uses_exact_chunk_sizes_when_S_is_not_divisible():
    n, count = 4, 1001  # chunks 251, 250, 250, 250
    sizes = chunk_sizes(count, n)
    for r, v in enumerate(volumes(call_for("all_reduce", "ring", n, count, 4))):
        # reduce-scatter: every chunk but (r+1); all-gather: every chunk but (r+2)
        assert v.bytes_sent == 4 * ((count - sizes[(r + 1) % n]) + (count - sizes[(r + 2) % n]))


def test_llama_7b_on_4_gpus_naive_112_GB_vs_ring_21_GB():
    """The worked example of LLaMA-7B's fp16 gradients (Φ = 7B) on 4 GPUs: ring 21 GB per GPU. The
    example totals naive at 2·N·Φ = 112 GB; on the wire it is 2·(N-1)·Φ = 84 GB, because the root's
    own gradient never travels."""
    phi, n = 7 * 10**9, 4
    naive = volumes(call_for("all_reduce", "naive", n, phi, 2))
    ring = volumes(call_for("all_reduce", "ring", n, phi, 2))
    total_naive = sum(v.bytes_sent + v.bytes_recv for v in naive) // 2  # each byte counted once
    assert total_naive == 2 * (n - 1) * phi * 2  # 84 GB moved; the quoted 2·N·Φ = 112 GB counts the root too
    assert naive[0].bytes_recv == naive[0].bytes_sent == (n - 1) * phi * 2  # the root: (N-1)·Φ each way
    assert ring[1].bytes_sent == 21 * GB


def test_rabenseifner_takes_2_log2_n_rounds_and_ring_bandwidth():
    for n in (2, 4, 8, 16):
        count = 64 * n
        for v in volumes(call_for("all_reduce", "rabenseifner", n, count, 4)):
            assert v.rounds == 2 * int(math.log2(n))
            assert v.bytes_sent == 2 * (n - 1) * count * 4 // n


def test_butterfly_moves_S_log2_n_in_log2_n_rounds():
    for n in (2, 4, 8):
        for v in volumes(call_for("all_reduce", "butterfly", n, 1000, 4)):
            assert v.rounds == int(math.log2(n)) and v.bytes_sent == 4000 * int(math.log2(n))


def _call(coll, algo, n, count):
    whole = count if coll in ("all_reduce", "reduce", "broadcast", "all_to_all") else count * n
    return call_for(coll, algo, n, whole, 4, root=n // 2, ranks_per_node=2)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(MODULES)), n=st.integers(1, 16), count=st.integers(0, 5000))
def test_every_byte_sent_is_received(key, n, count):
    """Conservation: summed over ranks, bytes and messages sent equal bytes and messages received."""
    assume(fits(key[1], n, 2))                       # hierarchical_2d: whole nodes of 2
    vs = volumes(_call(*key, n, count))
    assert sum(v.bytes_sent for v in vs) == sum(v.bytes_recv for v in vs)
    assert sum(v.messages_sent for v in vs) == sum(v.messages_recv for v in vs)
    if n == 1 or count == 0:
        assert all(v.bytes_sent == 0 and v.rounds == 0 for v in vs)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 64))
def test_ring_volume_tends_to_2S(n):
    """Patarasuk & Yuan 2009: as N grows, (N-1)/N -> 1 and ring traffic per rank -> 2S from below."""
    count = 10**6 * n
    v = volume(call_for("all_reduce", "ring", n, count, 1), 0)
    assert v.bytes_sent < 2 * count
    assert v.bytes_sent == 2 * count * (n - 1) // n
