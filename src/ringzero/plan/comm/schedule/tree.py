"""The binomial tree's whole-buffer schedules (reduce, broadcast, all_reduce) computed in one pass.

The tree of `plan.comm.links_recursive` (Thakur, Rabenseifner & Gropp 2005 §3): relative rank vr
talks to children vr + 2^k, k < top(vr), and its parent vr - 2^top(vr); every edge carries the
whole buffer. `asap` would number its steps by listing each rank's messages and walking their
dependencies; here the same rule is applied along the tree directly, O(n) integers instead of
objects, so that a 16,384-rank tree is built in milliseconds. The rule (`asap`): a rank posts its
first round at `start`, each later round one step after the latest of its own previous round and
the rounds of the messages it received there; a message goes at the later of its two ends' posts.

- reduce ("up"): a rank receives from its children in ascending k, then sends to its parent, so
  children are settled before their parent (vr descending);
- broadcast ("down"): a rank receives from its parent, then sends to its children in descending k
  (largest subtree first), so parents are settled first (vr ascending);
- all_reduce: the reduce to 0, then the broadcast from 0, each rank's rounds running on.

The tests hold this equal to `asap`'s listing message by message.
"""

from __future__ import annotations

from collections import defaultdict

from ringzero.plan.comm.links_recursive import _edges
from ringzero.plan.comm.schedule.step import Schedule, Step
from ringzero.plan.comm.volume import Call

WHOLE = ("all_reduce", "reduce", "broadcast")


def _up(n: int, root: int, start: list[int], out: list) -> list[int]:
    """The reduce to `root`; appends (step, src, dst, tag) to `out`, returns each rank's next post."""
    send = [0] * n                 # by relative rank: the post of its send round
    after = [0] * n                # by absolute rank
    for vr in range(n - 1, -1, -1):
        rank = (vr + root) % n
        parent, kids = _edges(n, vr)
        post = start[rank]
        for _, child in kids:
            m = max(post, send[child])
            out.append((m, (child + root) % n, rank, "up"))
            post = 1 + m
        send[vr] = post
        after[rank] = post if parent is None else post + 1
    return after


def _down(n: int, root: int, start: list[int], out: list) -> list[int]:
    """The broadcast from `root`, as `_up`."""
    sent = [0] * n                 # by relative rank: the post of its parent's send to it
    after = [0] * n
    for vr in range(n):
        rank = (vr + root) % n
        parent, kids = _edges(n, vr)
        post = start[rank]
        if parent is not None:
            m = max(sent[vr], post)
            out.append((m, (parent + root) % n, rank, "down"))
            post = 1 + m
        for _, child in reversed(kids):
            sent[child] = post
            post += 1
        after[rank] = post
    return after


def tree(call: Call) -> Schedule:
    """`call`'s steps (a whole-buffer collective with a non-empty buffer on n >= 2 ranks)."""
    n, nbytes = call.n, call.count * call.itemsize
    out: list = []
    start = [1] * n
    if call.collective == "all_reduce":
        _down(n, 0, _up(n, 0, start, out), out)
    elif call.collective == "reduce":
        _up(n, call.root, start, out)
    else:
        _down(n, call.root, start, out)
    by_step: dict[int, list] = defaultdict(list)
    for m in out:
        by_step[m[0]].append(m)
    steps = []
    for at in sorted(by_step):
        flows = by_step[at]
        k = len(flows)
        steps.append(Step(tuple(f[1] for f in flows), tuple(f[2] for f in flows), (nbytes,) * k, (1,) * k,
                          tag=flows[0][3]))
    return Schedule(call, tuple(steps))
