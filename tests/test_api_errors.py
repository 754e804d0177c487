"""Bad input: one clear error on every rank instead of a hang."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.comm.ops import Op, parse_op


def _errors(group):
    """Each bad call must raise on every rank; return the messages seen on this rank."""
    r = dist.get_rank(group)
    seen = []

    def expect(fn):
        try:
            fn()
        except (ValueError, TypeError) as exc:
            seen.append(str(exc))
        else:
            seen.append("NO ERROR")

    # element counts differ across ranks
    expect(lambda: comm.all_reduce(torch.ones(5 + r), group=group, algorithm="ring"))
    # dtypes differ across ranks
    expect(lambda: comm.all_reduce(torch.ones(4, dtype=torch.float32 if r else torch.float64),
                                   group=group, algorithm="ring"))
    # ranks disagree on the root
    expect(lambda: comm.broadcast(torch.ones(3), r % 2, group=group, algorithm="tree"))
    # all_to_all sizes that do not pair up
    n = dist.get_world_size(group)
    expect(lambda: comm.all_to_all([torch.empty(2) for _ in range(n)],
                                   [torch.ones(2 + (r == 0)) for _ in range(n)], group=group))
    # the group still works afterwards
    t = torch.ones(3)
    comm.all_reduce(t, group=group, algorithm="ring")
    seen.append(t.tolist())
    return seen


def test_mismatches_raise_on_every_rank(pool):
    results = pool.run(_errors, world=3)
    for seen in results:
        assert seen == results[0]
        assert seen[0] == ("all_reduce: ranks disagree on element count: rank 0 called all_reduce(float32 "
                           "x 5, op=sum, algorithm=ring); rank 1 called all_reduce(float32 x 6, op=sum, "
                           "algorithm=ring); rank 2 called all_reduce(float32 x 7, op=sum, algorithm=ring)")
        assert seen[1].startswith("all_reduce: ranks disagree on dtype: rank 0 called all_reduce(float64 x 4")
        assert seen[2].startswith("broadcast: ranks disagree on root: ranks 0, 2 called broadcast(float32 x 3, "
                                  "root=0, algorithm=tree); rank 1 called")
        assert seen[3] == "all_to_all: rank 0 sends 3 elements to rank 0, which expects 2"
        assert seen[4] == [3.0, 3.0, 3.0]


def _local_errors(group):
    msgs = []
    for fn in (
        lambda: comm.all_reduce(torch.ones(2), group=group, algorithm="nope"),
        lambda: comm.all_reduce(torch.ones(2, dtype=torch.int32), op="avg", group=group),
        lambda: comm.all_reduce(torch.ones(2), op="xor", group=group),
        lambda: comm.all_reduce(torch.ones(2, dtype=torch.complex64), group=group),
        lambda: comm.broadcast(torch.ones(2), 5, group=group),
        lambda: comm.all_gather_into_tensor(torch.empty(3), torch.ones(2), group=group),
    ):
        try:
            fn()
            msgs.append("NO ERROR")
        except (ValueError, TypeError) as exc:
            msgs.append(str(exc))
    return msgs


def test_local_bad_input_names_what_is_allowed(pool):
    msgs = pool.run(_local_errors, world=2)[0]
    assert msgs[0].startswith("unknown algorithm 'nope' for all_reduce; valid: auto, torch, naive, ring")
    assert msgs[1] == "all_reduce: op avg needs a floating-point dtype, got torch.int32"
    assert msgs[2].startswith("unsupported reduce op 'xor'; allowed: sum, avg, min, max, product")
    assert msgs[3].startswith("all_reduce: dtype torch.complex64 is not supported; allowed: float32")
    assert msgs[4] == "broadcast: root 5 is not a rank of this group (size 2)"
    assert msgs[5].startswith("all_gather_into_tensor: output must have 2 x 2 elements")


def test_parse_op_accepts_torch_and_strings():
    assert parse_op(dist.ReduceOp.SUM) is Op.SUM
    assert parse_op(dist.ReduceOp.MAX) is Op.MAX
    assert parse_op("prod") is Op.PRODUCT
    assert parse_op("AVG") is Op.AVG
