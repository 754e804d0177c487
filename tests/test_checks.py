"""The metadata handshake (`comm.check`, on in the tests): ranks whose calls disagree all raise the
same one-line error naming the ranks and what each called, instead of garbage, "ok" or a hang."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm import backend, check
from ringzero.comm.config import CommConfig

ALGORITHMS = ("ring", "butterfly", "rabenseifner", "tree", "naive", "torch", "auto")


def _outcome(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _mismatches(group, algorithm):
    """Calls that differ between ranks; then one that agrees, to show the group still works."""
    r = dist.get_rank(group)
    def ones(dtype=torch.float32):
        return torch.ones(8, dtype=dtype)

    seen = [
        # float32 vs int32: with checks off, butterfly and rabenseifner return inf
        _outcome(lambda: comm.all_reduce(ones(torch.int32 if r == 0 else torch.float32), group=group,
                                         algorithm=algorithm)),
        # rank 1 gathers while the others reduce (same element count)
        _outcome(lambda: comm.all_gather([torch.empty(8) for _ in range(3)], ones(), group=group,
                                         algorithm="ring")
                 if r == 1 else comm.all_reduce(torch.ones(24), group=group, algorithm=algorithm)),
        # rank 2 exchanges (a longer description) while the others reduce
        _outcome(lambda: comm.all_to_all([torch.empty(1) for _ in range(3)],
                                         [torch.ones(1) for _ in range(3)], group=group)
                 if r == 2 else comm.all_reduce(ones(), group=group, algorithm=algorithm)),
        # an average of int32 is rejected on rank 0 alone; its peers must not wait for it
        _outcome(lambda: comm.all_reduce(ones(torch.int32 if r == 0 else torch.float32), op="avg",
                                         group=group, algorithm=algorithm)),
    ]
    t = ones()
    comm.all_reduce(t, group=group, algorithm=algorithm)
    return seen + [t.tolist()]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_mismatched_calls_raise_one_line_on_every_rank(pool, algorithm):
    results = pool.run(_mismatches, algorithm, world=3)
    chosen = f"{algorithm}" if algorithm != "auto" else "auto ("
    for seen in results:
        assert seen == results[0], "every rank raises the same message"
        dtype, gather, a2a, avg, after = seen
        assert dtype.startswith("ValueError: all_reduce: ranks disagree on dtype: rank 0 called "
                                f"all_reduce(int32 x 8, op=sum, algorithm={chosen}")
        assert "; ranks 1, 2 called all_reduce(float32 x 8, op=sum" in dtype
        assert gather.startswith("ValueError: ranks disagree on the collective: ranks 0, 2 called "
                                 "all_reduce(float32 x 24, op=sum")
        assert gather.endswith("; rank 1 called all_gather(float32 x 24, algorithm=ring)")
        assert "ranks 0, 1 called all_reduce(float32 x 8" in a2a and "rank 2 called all_to_all(float32" in a2a
        assert avg == ("TypeError: rank 0: all_reduce: op avg needs a floating-point dtype, got "
                       "torch.int32 (ranks 1, 2 stop too)")
        assert after == [3.0] * 8
        assert "\n" not in "".join(seen[:4])


def _abandoned_call(group):
    """Rank 1 enters a collective and leaves it on an exception before its handshake."""
    seen = []
    if dist.get_rank(group) == 1:
        try:
            comm.all_reduce(None, group=group)
        except AttributeError:
            pass
    for _ in range(2):
        t = torch.ones(4)
        seen.append(_outcome(lambda: comm.all_reduce(t, group=group, algorithm="ring")))
    return seen + [t.tolist()]


def test_a_rank_ahead_by_one_call_is_named(pool):
    results = pool.run(_abandoned_call, world=3)
    for seen in results:
        assert seen[0] == results[0][0]
        # the pool's groups have served earlier tests: call numbers count from wherever they are
        m = re.fullmatch(r"ValueError: all_reduce: rank 1 is at call (\d+) on this group while ranks 0, 2 "
                         r"are at call (\d+): rank 1 skipped a collective or ranks 0, 2 made an extra one",
                         seen[0])
        assert m and int(m[1]) == int(m[2]) + 1, seen[0]
        # every rank continues from the largest call number, so the next call pairs up again
        assert seen[1:] == ["ok", [3.0] * 4]


def _skipped(group):
    """Rank 1 skips the broadcast; its next call meets the others' broadcast. Each rank stops at
    its first error, as a program would."""
    calls = [lambda: comm.broadcast(torch.ones(3), 0, group=group, algorithm="tree"),
             lambda: comm.all_reduce(torch.ones(4), group=group, algorithm="ring")]
    for call in calls[dist.get_rank(group) == 1:]:
        outcome = _outcome(call)
        if outcome != "ok":
            return outcome
    return "ok"


def test_a_skipped_collective_names_each_ranks_call(pool):
    results = pool.run(_skipped, world=3)
    want = ("ValueError: ranks disagree on the collective: ranks 0, 2 called broadcast(float32 x 3, "
            "root=0, algorithm=tree); rank 1 called all_reduce(float32 x 4, op=sum, algorithm=ring)")
    assert results == [want] * 3


def _shapes(group):
    r, n = dist.get_rank(group), dist.get_world_size(group)
    seen = [
        # only rank 1's input disagrees with its (correct-looking) output
        _outcome(lambda: comm.all_gather_into_tensor(torch.empty(6), torch.ones(3 if r == 1 else 2),
                                                     group=group, algorithm="ring")),
        # same total, different list sizes
        _outcome(lambda: comm.all_gather([torch.empty(s) for s in ([2, 3, 2] if r == 0 else [3, 2, 2])],
                                         torch.ones(([2, 3, 2] if r == 0 else [3, 2, 2])[r]), group=group)),
        # rank 2 sends 3 elements to everyone, who expect 2
        _outcome(lambda: comm.all_to_all([torch.empty(2) for _ in range(n)],
                                         [torch.ones(2 + (r == 2)) for _ in range(n)], group=group)),
        # uneven but consistent: rank i sends 1 + i + j elements to rank j
        _outcome(lambda: comm.all_to_all([torch.empty(1 + i + r) for i in range(n)],
                                         [torch.ones(1 + r + j) for j in range(n)], group=group)),
        # dst's gather_list is wrong; the other ranks must stop too
        _outcome(lambda: comm.gather(torch.ones(2), [torch.empty(2)] * (n - 1) if r == 0 else None,
                                     dst=0, group=group)),
    ]
    # hierarchical on ranks that disagree on the node size
    with comm.configure(ranks_per_node=1 + (r == 0)):
        seen.append(_outcome(lambda: comm.all_reduce(torch.ones(4), group=group, algorithm="hierarchical")))
    return seen


def test_shapes_and_sizes_that_do_not_fit_across_ranks(pool):
    results = pool.run(_shapes, world=3)
    for seen in results:
        assert seen == results[0]
        into, lists, a2a, uneven, gather, node = seen
        assert into == ("ValueError: rank 1: all_gather_into_tensor: output must have 3 x 3 elements of "
                        "torch.float32, got 6 of torch.float32 (ranks 0, 2 stop too)")
        assert lists == ("ValueError: all_gather: ranks disagree on the sizes of the tensor list "
                         "(rank 0: [2, 3, 2]; ranks 1, 2: [3, 2, 2])")
        assert a2a == "ValueError: all_to_all: rank 2 sends 3 elements to rank 0, which expects 2"
        assert uneven == "ok"
        assert gather.startswith("ValueError: rank 0: gather: rank 0 (dst) needs gather_list of 3 tensors")
        assert node.startswith("ValueError: all_reduce: ranks disagree on ranks per node: rank 0 called "
                               "all_reduce(float32 x 4, op=sum, algorithm=hierarchical, ranks_per_node=2)")


def _all_gathers_per_call(group):
    """How many backend all-gathers each checked collective makes (the handshake's one)."""
    real, count = backend.all_gather_single, [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    backend.all_gather_single = counting
    try:
        out = {}
        for algorithm in ("ring", "rabenseifner", "auto"):
            before = count[0]
            comm.all_reduce(torch.ones(1024), group=group, algorithm=algorithm)
            out[algorithm] = count[0] - before
        before = count[0]
        comm.all_to_all([torch.empty(2) for _ in range(3)], [torch.ones(2) for _ in range(3)], group=group)
        out["all_to_all"] = count[0] - before
    finally:
        backend.all_gather_single = real
    return out


def test_the_handshake_is_one_backend_all_gather(pool):
    for out in pool.run(_all_gathers_per_call, world=3):
        assert out == {"ring": 1, "rabenseifner": 1, "auto": 1, "all_to_all": 1}


@pytest.mark.parametrize("env, checks", [
    ({}, False),
    ({"RINGZERO_CHECKS": "1"}, True),
    ({"RINGZERO_CHECKS": "off"}, False),
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, True),
    ({"TORCH_DISTRIBUTED_DEBUG": "INFO"}, False),
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "RINGZERO_CHECKS": "0"}, False),
    ({"TORCH_DISTRIBUTED_DEBUG": "OFF", "RINGZERO_CHECKS": "yes"}, True),
])
def test_checks_follow_the_environment(monkeypatch, env, checks):
    for name in ("RINGZERO_CHECKS", "TORCH_DISTRIBUTED_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert CommConfig().checks is checks


def test_an_unknown_checks_value_is_rejected(monkeypatch):
    monkeypatch.setenv("RINGZERO_CHECKS", "maybe")
    with pytest.raises(ValueError, match="RINGZERO_CHECKS='maybe': use 1 or 0"):
        CommConfig()


def test_rank_lists_are_compact():
    assert check._ranks([3]) == "rank 3"
    assert check._ranks([0, 1]) == "ranks 0, 1"
    assert check._ranks([0, 2, 3, 4, 5, 7]) == "ranks 0, 2-5, 7"
