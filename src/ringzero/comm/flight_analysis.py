"""Why a job hung, read from its ranks' flight recorder dumps the way torch's `fr_trace` reads NCCL's.

A stalled job leaves a JSON file with every rank's dump (`comm.flight_watch.diagnose`: {rank:
{"version", "pg_config", "pg_status", "entries"}}, each entry one of torch's flight recorder
entries, `comm.flight.dump`). `load` reads it; `verdict` matches the ranks' calls on each process
group by `collective_seq_id`, as torch's analyzer (torch/distributed/flight_recorder,
`build_collectives`) matches them, and says what the first broken collective is, in the words the
analyzer prints, on one line:

    Not all ranks joining collective, sequence number: 5; group info: 0:default_pg; collective:
    ringzero:all_reduce; missing ranks: {1}; collective state: started; rank 1 is in no collective
    (frozen, busy outside collectives, or returned)

    Collective sequence number: 7 has errors; group info: 0:default_pg; collective:
    ringzero:all_gather; error msg: Culprit rank 2; Error type: COLLECTIVE_TYPE_MISMATCH, Expected
    collective type: 'all_gather' does not match found collective type: 'all_reduce' (a culprit
    skipped all_gather #7, or called another collective in its place)

- a rank that never arrived (frozen before the call, or it went on without it: then it waits in
  another group's collective, which the line names) is a missing rank;
- a rank that called another collective at that point, or skipped one so that its next call stands
  where its peers' skipped one does (the two look the same in the records), is a culprit of a type
  or size mismatch; the expected call is the majority's (torch takes the first rank's; with two
  ranks that disagree, ringzero too takes the lower rank's, and no record can say who is wrong).

Differences from torch's analyzer, for dumps published while a job runs: a rank publishes its
history only once one of its calls is stuck (`flight_watch.state`), so a rank with no entry for a
call is missing only if no rank completed that call (a collective completes nowhere before every
member arrived) and it shows no later call on that group; state differences (completed here,
started there, as a rooted call may be) are not errors. torch-free: it runs where the dump is read.
"""

from __future__ import annotations

import json

NO_ERRORS = ("No errors found for this collective entry, There could be some other reasons why we see "
             "collective timeout.")


def load(path: str) -> dict[int, list[dict]]:
    """rank -> its entries, from the stall report's JSON file (or {rank: [entries]})."""
    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: not a flight recorder dump ({why}; expected {{rank: {{\"entries\": [...]}}}} "
                          f"as a stalled ringzero job writes)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise bad("not an object of ranks")
    out = {}
    for key, dump in data.items():
        if not str(key).isdigit():
            raise bad(f"key {key!r} is not a rank")
        entries = dump.get("entries", []) if isinstance(dump, dict) else dump
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and {"collective_seq_id", "profiling_name", "process_group"} <= e.keys()
                for e in entries):
            raise bad(f"rank {key}'s entries are not flight recorder entries")
        out[int(key)] = entries
    return dict(sorted(out.items()))


def _pg_desc(e: dict) -> str:
    name, desc = e["process_group"]
    return f"{name}:{desc}" if desc != "undefined" else name


def _op(e: dict) -> str:
    return e["profiling_name"].partition(":")[2].split(" ")[0]


_NO_INPUT_CHECK = {"all_to_all", "scatter"}
_NO_OUTPUT_CHECK = {"all_to_all", "gather"}
"""Sizes torch's `Op.match` does not compare: a scatter's input and a gather's output are the
root's alone, an all-to-all's may be uneven."""


def mismatch(expected: dict, found: dict) -> str:
    """torch's `Op.match` for collectives, as its analyzer prints it ("" when they match)."""
    op = _op(expected)
    if op != _op(found):
        return (f"COLLECTIVE_TYPE_MISMATCH, Expected collective type: '{op}' does not match found "
                f"collective type: '{_op(found)}'")
    for side, skip in (("input", _NO_INPUT_CHECK), ("output", _NO_OUTPUT_CHECK)):
        want, got = expected[f"{side}_sizes"], found[f"{side}_sizes"]
        if op not in skip and want != got:
            return (f"SIZE_OR_SYNTAX_MISMATCH, Expected {side} sizes: '{want}' does not match found "
                    f"{side} sizes: '{got}'")
    want, got = set(expected.get("input_dtypes", [])), set(found.get("input_dtypes", []))
    if want and got and want != got:
        return f"COLLECTIVE_DTYPE_MISMATCH, Expected dtypes: '{want}' does not match found dtype: '{got}'"
    return ""


def majority(calls: dict[int, dict]) -> dict:
    """Of the ranks' entries for one call (rank -> entry), the one most of them match: the call
    they were expected to make (the lowest rank's among equals)."""
    votes = {r: sum(not mismatch(other, e) for other in calls.values()) for r, e in calls.items()}
    return calls[max(sorted(votes), key=votes.get)]


def _groups(dumps: dict[int, list[dict]]) -> dict[str, dict[int, dict[int, dict]]]:
    """group name -> rank -> collective_seq_id -> entry (collectives only)."""
    out: dict[str, dict[int, dict[int, dict]]] = {}
    for rank, entries in dumps.items():
        for e in entries:
            if not e.get("is_p2p", False):
                out.setdefault(e["process_group"][0], {}).setdefault(rank, {})[e["collective_seq_id"]] = e
    return out


def _where(dumps: dict[int, list[dict]], rank: int, group: str) -> str:
    """What a missing rank is doing instead, as far as its dump says."""
    running = [e for e in dumps.get(rank, []) if e["state"] == "started" and e["process_group"][0] != group]
    if running:
        e = running[0]
        return (f"rank {rank} is in {_op(e)} #{e['collective_seq_id']} on group {_pg_desc(e)} (it went on "
                f"without this one)")
    return f"rank {rank} is in no collective (frozen, busy outside collectives, or returned)"


def _check(dumps, group: str, calls: dict[int, dict[int, dict]], seq: int) -> str:
    """What is wrong with call `seq` of `group` ("" when nothing is)."""
    present = {r: by_seq[seq] for r, by_seq in calls.items() if seq in by_seq}
    first = present[min(present)]
    members = set(first.get("ranks") or calls)
    head = f"group info: {_pg_desc(first)}; collective: {first['profiling_name']}"
    expected = majority(present)
    if any(mismatch(expected, e) for e in present.values()):
        msg = ", ".join(f"Culprit rank {r}; Error type: {mismatch(expected, e)}"
                        for r, e in sorted(present.items()) if mismatch(expected, e))
        return (f"Collective sequence number: {seq} has errors; group info: {_pg_desc(expected)}; collective: "
                f"{expected['profiling_name']}; error msg: {msg} (a culprit skipped {_op(expected)} #{seq}, or called "
                f"another collective in its place)")
    if any(e["state"] == "completed" for e in present.values()) or all(e["state"] != "started" for e in present.values()):
        return ""
    absent = {m for m in members - present.keys() if not any(s > seq for s in calls.get(m, {}))}
    missing, unknown = sorted(absent & dumps.keys()), sorted(absent - dumps.keys())
    if missing:
        hints = "; ".join(_where(dumps, m, group) for m in missing)
        return (f"Not all ranks joining collective, sequence number: {seq}; {head}; missing ranks: {set(missing)}; "
                f"collective state: {first['state']}; {hints}")
    if unknown:
        return (f"We cannot decide what's wrong with this collective entry because we missed FR dumps from ranks "
                f"({set(unknown)}) so we don't have enough information; {head}; sequence number: {seq}")
    return ""


def verdict(dumps: dict[int, list[dict]]) -> str:
    """One line: the first broken collective (the earliest made, when several groups have one), in
    torch's fr_trace wording, or torch's "No errors found" line."""
    found = []
    for group, calls in _groups(dumps).items():
        for seq in sorted({s for by_seq in calls.values() for s in by_seq}):
            line = _check(dumps, group, calls, seq)
            if line:
                made = min(by_seq[seq]["time_created_ns"] or 0 for by_seq in calls.values() if seq in by_seq)
                found.append((made, line))
                break
    return min(found)[1] if found else NO_ERRORS
