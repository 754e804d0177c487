"""The explainer: the textbook walk-through of the ring on 4 GPUs A-D, correct symbolic results for
every algorithm, the planner's totals, the CLI, and the symbolic Comm's guards against broken
algorithms."""

import dataclasses
import json
import threading

import numpy as np
import pytest

from ringzero.cli import main
from ringzero.comm import symbolic
from ringzero.comm.explain import explain, normalize
from ringzero.comm.registry import TABLE
from ringzero.comm.symbolic import JUNK, Sym, SymbolicError, combine, fmt
from ringzero.plan.comm.algorithms import NODE_AWARE, fits
from ringzero.plan.comm.volume import call_for, volume

PAIRS = [(c, a) for c, algs in TABLE.items() for a in algs]
WORLDS = (1, 2, 3, 4, 5, 8, 16)
ROOTED = ("reduce", "broadcast", "gather", "scatter")


def _s(buf):
    return [fmt(v, compact=False) for v in buf]


def _full(index, n):
    return "+".join(f"{symbolic.letter(r)}{index}" for r in range(n))


# --- the textbook walk-through: ring all-reduce on GPUs A, B, C, D -----------------------------

def test_ring_all_reduce_matches_the_seed_walkthrough():
    ex = explain("all-reduce", "ring", 4)
    assert ex.steps == 6  # N-1 reduce-scatter steps + N-1 all-gather steps
    # Step 1: GPU A sends a0 to B, B sends b1 to C, C sends c2 to D, D sends d3 to A.
    assert [(m.src, m.dst, _s(m.contents)) for m in ex.messages_at(1)] == [
        (0, 1, ["a0"]), (1, 2, ["b1"]), (2, 3, ["c2"]), (3, 0, ["d3"])]
    # GPU B now has a0+b0, GPU C b1+c1, GPU D c2+d2, GPU A d3+a3.
    after1 = [_s(buf) for buf in ex.holdings[0]]
    assert after1[1][0] == "a0+b0" and after1[2][1] == "b1+c1"
    assert after1[3][2] == "c2+d2" and after1[0][3] == "a3+d3"
    # Step 2: GPU B sends a0+b0 to C, which adds its own c0 and gets a0+b0+c0.
    assert (1, 2, ["a0+b0"]) in [(m.src, m.dst, _s(m.contents)) for m in ex.messages_at(2)]
    assert _s(ex.holdings[1][2])[0] == "a0+b0+c0"
    # After the reduce-scatter every rank holds exactly one fully reduced chunk, and each chunk
    # is complete somewhere (one GPU holds a0+b0+c0+d0, another a1+b1+c1+d1, …).
    after3 = [_s(buf) for buf in ex.holdings[2]]
    complete = [[i for i in range(4) if row[i] == _full(i, 4)] for row in after3]
    assert all(len(c) == 1 for c in complete)
    assert sorted(c[0] for c in complete) == [0, 1, 2, 3]
    # Every step each rank sends one chunk to its right neighbour; the all-gather only forwards
    # complete chunks (no more additions).
    for s in range(1, 7):
        assert sorted((m.src, m.dst) for m in ex.messages_at(s)) == [(r, (r + 1) % 4) for r in range(4)]
        assert all(len(m.contents) == 1 for m in ex.messages_at(s))
    for s in range(4, 7):
        assert all(_s(m.contents)[0].count("+") == 3 for m in ex.messages_at(s))
    # After N-1 more steps every GPU holds every complete chunk.
    full = [_full(i, 4) for i in range(4)]
    assert all(_s(buf) == full for buf in ex.holdings[5]) and all(_s(buf) == full for buf in ex.final)


def test_ring_cli_prints_the_walkthrough_and_the_planners_totals(capsys):
    assert main(["explain", "all-reduce", "--algorithm", "ring", "--world", "4"]) == 0
    out = capsys.readouterr().out
    for line in ("A → B: a0", "B → C: b1", "C → D: c2", "D → A: d3", "B → C: a0+b0"):
        assert line in out
    assert "a0+b0+c0+d0" in out and "Step 6" in out and "Step 7" not in out
    call = call_for("all_reduce", "ring", 4, (1 << 20) // 4)
    totals = out.split("Totals from the planner")[1].splitlines()
    for r in range(4):
        v = volume(call, r)
        row = next(line for line in totals if line.strip().startswith(f"{'ABCD'[r]} ({r})"))
        assert row.split()[2:5] == [str(v.rounds), f"{v.bytes_sent:,}", f"{v.bytes_recv:,}"]
        assert v.bytes_sent == 2 * 3 * (1 << 20) // 4  # 2S(N-1)/N per rank (Patarasuk & Yuan 2009)


def test_json_totals_equal_the_planner(capsys):
    assert main(["explain", "all_reduce", "--algorithm", "ring", "--world", "3", "--bytes", "1000",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["count"] == 250 and data["totals"]["steps"] == 4
    call = call_for("all_reduce", "ring", 3, 250)
    assert data["totals"]["ranks"] == [dict(rank=r, **dataclasses.asdict(volume(call, r))) for r in range(3)]
    assert data["steps"][0]["messages"][0] == {"src": 0, "dst": 1, "round": 1, "contents": ["a0"]}
    assert data["final"] == [["a0+b0+c0", "a1+b1+c1", "a2+b2+c2"]] * 3


@pytest.mark.parametrize("argv, needle", [
    (["all-reduce", "--algorithm", "nope"], "valid: naive, ring"),
    (["all-reduce", "--algorithm", "torch"], "valid:"),
    (["all-reduce", "--world", "17"], "between 1 and 16"),
    (["all-reduce", "--world", "0"], "between 1 and 16"),
    (["allreduce"], "valid: all-reduce"),
    (["reduce", "--root", "4"], "allowed: 0..3"),
    (["all-gather", "--root", "1"], "--root applies only"),
    (["all-reduce", "--bytes", "lots"], "bad size"),
    (["all-reduce", "--bytes", "3B"], "--bytes 3B holds no float32 element; allowed: 4 B or more"),
    (["all-reduce", "--bytes", "0"], "--bytes 0 holds no float32 element"),
    (["all-gather", "--bytes", "12", "--world", "4"], "no float32 element per rank on 4 ranks; allowed: 16 B"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys, argv, needle):
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_the_smallest_sizes_that_hold_an_element_are_explained(capsys):
    for argv, count in ((["all-reduce", "--bytes", "4"], 1), (["all-gather", "--bytes", "16"], 4)):
        assert main(["explain", *argv, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["totals"]["count"] == count


def test_bytes_take_the_units_of_every_command(capsys):
    """1MB is 10^6 bytes and 1MiB 2^20, as in `ringzero plan` and `bench comm` (plan.units)."""
    for text, count in (("1MB", 250_000), ("1MiB", 1 << 18), ("4K", 1024)):
        assert main(["explain", "all-reduce", "--bytes", text, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["totals"]["count"] == count


def test_a_failure_after_checking_is_not_bad_input(capsys, monkeypatch):
    from ringzero.comm import explain as explain_mod

    def buggy(*args, **kw):
        raise ValueError("a bug in the walk-through")
    monkeypatch.setattr(explain_mod, "explain", buggy)
    assert main(["explain", "all-reduce"]) == 1
    assert "a bug in the walk-through" in capsys.readouterr().err


def test_names_accept_dash_and_underscore():
    assert normalize("all-to-all") == normalize("all_to_all") == "all_to_all"
    assert normalize("Reduce-Scatter") == "reduce_scatter"


# --- every collective and algorithm ----------------------------------------------------------------

def _cases(collective, algorithm):
    for n in WORLDS:
        roots = sorted({0, n // 2, n - 1}) if collective in ROOTED else [0]
        per_node = [k for k in (None, 1, 2, 3) if fits(algorithm, n, k)] if algorithm in NODE_AWARE else [None]
        for root in roots:
            for rpn in per_node:
                yield n, root, rpn


def _wrong(collective, n, root, final):
    """Where the symbolic result differs from the collective's definition (None if nowhere)."""
    def total(i):
        return Sym((q, i) for q in range(n))

    want = {  # rank -> {element: value}; ranks and elements not listed are scratch
        "all_reduce": lambda r: {i: total(i) for i in range(n)},
        "reduce": lambda r: {i: total(i) for i in range(n)} if r == root else {},
        "reduce_scatter": lambda r: {r: total(r)},
        "all_gather": lambda r: {i: Sym.term(i, i) for i in range(n)},
        "gather": lambda r: {i: Sym.term(i, i) for i in range(n)} if r == root else {},
        "broadcast": lambda r: {i: Sym.term(root, i) for i in range(n)},
        "scatter": lambda r: {r: Sym.term(root, r)},
        "all_to_all": lambda r: {i: Sym.term(i, r) for i in range(n)},
    }[collective]
    for r in range(n):
        for i, v in want(r).items():
            if final[r][i] != v:
                return f"rank {r} element {i}: {fmt(final[r][i], False)} instead of {fmt(v, False)}"
    return None


@pytest.mark.parametrize("collective, algorithm", PAIRS)
def test_symbolic_result_is_the_collective(collective, algorithm):
    failures = []
    for n, root, rpn in _cases(collective, algorithm):
        ex = explain(collective, algorithm, n, root, rpn)
        bad = _wrong(collective, n, root, ex.final)
        if bad:
            failures.append(f"n={n} root={root} ranks_per_node={rpn}: {bad}")
        if ex.steps and ex.holdings[-1] != ex.final:
            failures.append(f"n={n} root={root} ranks_per_node={rpn}: last step's holdings are not final")
    assert not failures


@pytest.mark.parametrize("collective, algorithm", PAIRS)
def test_symbolic_rounds_and_bytes_equal_the_planner(collective, algorithm):
    """One element per chunk: the symbolic Comm counts like the meter, so it must match the plan."""
    failures = []
    for n, root, rpn in _cases(collective, algorithm):
        ex = explain(collective, algorithm, n, root, rpn)
        call = call_for(collective, algorithm, n, n, 4, root, rpn)
        sent = [0] * n
        for m in ex.messages:
            sent[m.src] += 4 * len(m.contents)
        plan = [volume(call, r) for r in range(n)]
        if list(ex.rounds) != [v.rounds for v in plan] or sent != [v.bytes_sent for v in plan]:
            failures.append((n, root, rpn, ex.rounds, sent, plan))
    assert not failures


# --- the symbolic Comm ---------------------------------------------------------------------------

def _bufs(n, size=1):
    def setup(r):
        buf = np.empty(size, dtype=object)
        buf[:] = [Sym.term(r, i) for i in range(size)]
        return (buf,), buf
    return setup


def test_symbols_print_as_in_the_seed():
    s = combine(combine(Sym.term(2, 0), Sym.term(0, 0)), Sym.term(1, 0))
    assert fmt(s) == "a0+b0+c0" and fmt(None) == "·"
    assert combine(None, s) is JUNK and fmt(JUNK) == "?"
    five = Sym((r, 3) for r in range(5))
    assert fmt(five) == "a3+b3+c3+d3+e3" and fmt(five, compact=True) == "a3+…+e3"


def test_steps_follow_dependencies_not_thread_timing():
    """C -> B, then B forwards to A: step 2. A root taking one message per round: steps 1, 2."""
    def chain(c, buf):
        if c.rank == 2:
            c.sendrecv(sends=[(1, buf)])
        elif c.rank == 1:
            tmp = c.empty(1)
            c.sendrecv(recvs=[(2, tmp)])
            c.reduce(buf, tmp)
            c.sendrecv(sends=[(0, buf)])
        else:
            c.sendrecv(recvs=[(1, buf)])

    trace = symbolic.run(chain, 3, _bufs(3))
    assert [(m.step, m.src, m.dst, fmt(m.contents[0])) for m in trace.messages] == [
        (1, 2, 1, "c0"), (2, 1, 0, "b0+c0")]
    assert trace.rounds == (1, 2, 1)

    def serial_root(c, buf):
        if c.rank == 0:
            for peer in (1, 2):
                tmp = c.empty(1)
                c.sendrecv(recvs=[(peer, tmp)])
                c.reduce(buf, tmp)
        else:
            c.sendrecv(sends=[(0, buf)])

    trace = symbolic.run(serial_root, 3, _bufs(3))
    assert [(m.step, m.src) for m in trace.messages] == [(1, 1), (2, 2)]
    assert [(s, fmt(b[0])) for s, b in trace.snapshots[0]] == [(0, "a0"), (1, "a0+b0"), (2, "a0+b0+c0")]


def test_deadlock_is_reported_not_hung():
    def receive_first(c, buf):
        c.sendrecv(recvs=[((c.rank - 1) % c.size, buf)])
        c.sendrecv(sends=[((c.rank + 1) % c.size, buf)])

    with pytest.raises(SymbolicError, match="deadlock: rank 0 waits for message #1 from rank 3"):
        symbolic.run(receive_first, 4, _bufs(4), timeout=30)


@pytest.mark.parametrize("body, match", [
    (lambda c, buf: c.sendrecv(sends=[(c.rank, buf)]), "addressed peer"),
    (lambda c, buf: c.sendrecv(sends=[(1, buf)]) if c.rank == 0 else None,
     "rank 0 sent 1 message.s. to rank 1, which posted 0 receive"),
    (lambda c, buf: c.sendrecv(sends=[(1, buf)]) if c.rank == 0 else c.exchange(recvs=[(0, buf)]),
     "rank 1 never waited on its receive #1 from rank 0"),
    (lambda c, buf: c.sendrecv(sends=[(1, buf)]) if c.rank == 0 else c.sendrecv(recvs=[(0, c.empty(2))]),
     "posted a receive of 2 elements"),
    (lambda c, buf: 1 / 0 if c.rank == 0 else None, "rank 0 raised ZeroDivisionError"),
])
def test_broken_algorithms_raise_a_clear_error(body, match):
    with pytest.raises(SymbolicError, match=match):
        symbolic.run(body, 2, _bufs(2), timeout=30)


def test_a_rank_that_never_returns_hits_the_timeout():
    stop = threading.Event()

    def spin(c, buf):
        if c.rank == 1:
            stop.wait(30)

    try:
        with pytest.raises(SymbolicError, match="rank 1 did not finish within 0.2 s"):
            symbolic.run(spin, 2, _bufs(2), timeout=0.2)
    finally:
        stop.set()
