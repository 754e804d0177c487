"""Any algorithm's global steps, from the messages each rank sends and receives (`plan.comm.links`).

Each rank's messages fall into rounds (one per step tag of `plan.comm.links`, in the order the
algorithm's code takes them: `round_key`). A rank posts its first round at step 1 and each later
round one step after the latest step it has seen, its own previous round or a message it received
there; a message goes at the later of its sender's and its receiver's round. This is the rule the
explainer's symbolic ranks number the real code's messages by (`ringzero.comm.symbolic`), so the
tests can hold the two equal message by message: a root that receives from its children in turn
takes them at successive steps, and a ring's 2(n-1) rounds are steps 1..2(n-1).
"""

from __future__ import annotations

from collections import defaultdict

from ringzero.plan.comm.links import messages
from ringzero.plan.comm.schedule.step import Schedule, Step, compress
from ringzero.plan.comm.volume import Call

PHASES = ("fold_in", "up", "scatter", "halve", "node_rs", "ring", "leaders", "cross", "double",
          "node_ag", "down", "fold_out", "all", "pair")
"""The phases of every algorithm in the order they run (an algorithm has a few of them)."""
_DESCENDING = ("down", "halve", "scatter")
"""Phases whose step argument counts down: a broadcast feeds its largest subtree (highest bit)
first, recursive halving starts at mask p/2, the binomial scatter with the widest range."""


def round_key(tag: tuple) -> tuple:
    """Where a step tag of `plan.comm.links` falls in a rank's order of rounds."""
    sign = -1 if tag[0] in _DESCENDING else 1
    return PHASES.index(tag[0]), tuple(sign * x for x in tag[1:])


def schedule(call: Call, drop: tuple[str, ...] = ()) -> Schedule:
    """`call`'s steps, every message listed (O(messages) memory: for worlds where that is small).
    `drop`: phases to leave out (those a compressed builder writes itself)."""
    n = call.n
    mine = [[m for m in messages(call, r) if m.step[0] not in drop] for r in range(n)] if n > 1 else []
    ranks = [sorted({m.step for m in ms}, key=round_key) for ms in mine]
    round_of = [{t: j for j, t in enumerate(rs)} for rs in ranks]
    incoming: list[list[list[tuple[int, int]]]] = [[[] for _ in rs] for rs in ranks]
    sent: list = []
    for r, ms in enumerate(mine):
        for m in ms:
            if m.src == r:
                j_send, j_recv = round_of[r][m.step], round_of[m.dst][m.step]
                incoming[m.dst][j_recv].append((r, j_send))
                sent.append((m, j_send, j_recv))
    post = _posts(incoming)
    by_step: dict[int, list] = defaultdict(list)
    for m, js, jr in sent:
        by_step[max(post[m.src][js], post[m.dst][jr])].append(m)
    steps = []
    for at in sorted(by_step):
        ms = by_step[at]
        steps.append(Step(tuple(m.src for m in ms), tuple(m.dst for m in ms), tuple(m.nbytes for m in ms),
                          tuple(m.pieces for m in ms), tag=ms[0].step[0]))
    if steps and len(steps) != max(by_step):
        raise AssertionError(f"{call.algorithm} leaves a step with no message: steps {sorted(by_step)}")
    return Schedule(call, tuple(compress(steps)))


def _posts(incoming: list[list[list[tuple[int, int]]]]) -> list[list[int]]:
    """post[r][j]: the step rank r posts round j at (see the module), by an iterative depth-first
    walk over the rounds each round waits for (no recursion: a ring of 256 ranks chains 510 deep)."""
    post: list[list[int]] = [[0] * len(rs) for rs in incoming]
    for r0 in range(len(incoming)):
        for j0 in range(len(incoming[r0])):
            stack = [(r0, j0)]
            while stack:
                r, j = stack[-1]
                if post[r][j]:
                    stack.pop()
                    continue
                if j == 0:
                    post[r][j] = 1
                    stack.pop()
                    continue
                needs = [(r, j - 1)] + incoming[r][j - 1]
                todo = [x for x in needs if not post[x[0]][x[1]]]
                if todo:
                    stack.extend(todo)
                    continue
                post[r][j] = 1 + max(post[a][b] for a, b in needs)
                stack.pop()
    return post
