"""One rule for every bandwidth flag of every command (`plan.units`): a plain number is GB/s,
units are bytes or bits per second, an ambiguous one ("Gb/s", "50G") is refused with the units
accepted, and the value comes back in the unit typed. The flags are found in the parsers
themselves, so a new one that skips the rule fails here."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from ringzero import cli
from ringzero.plan.units import Bandwidth, BandwidthFlag, Link

LOOKS_LIKE_A_BANDWIDTH = re.compile(r"-bw$|bandwidth|inter-node|gbps", re.IGNORECASE)
SAYS_A_BANDWIDTH = re.compile(r"bandwidth|GB/s|Gbit|bytes/s|GBPS", re.IGNORECASE)
KNOWN = {("plan", "--intra-bw"), ("plan", "--inter-bw"), ("simulate collective", "--nvlink-bw"),
         ("simulate collective", "--nic-bw"), ("simulate step", "--intra-bw"), ("simulate step", "--inter-bw"),
         ("train", "--emulate-inter-node"), ("bench comm", "--emulate-inter-node"), ("bench train", "--emulate-inter-node")}


def _walk(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, [*path, name])
        elif action.option_strings:
            yield " ".join(path), parser, action


def bandwidth_flags() -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    """(command, its parser, action) of every flag that names or describes a bandwidth, in every
    command's parser (each built with its own options, as `ringzero COMMAND` builds it)."""
    out = []
    for command in cli.COMMANDS:
        for where, parser, action in _walk(cli.build_parser(only=command), []):
            if not where.startswith(command):
                continue
            named = any(LOOKS_LIKE_A_BANDWIDTH.search(o) for o in action.option_strings)
            told = SAYS_A_BANDWIDTH.search(f"{action.metavar or ''} {action.help or ''}")
            if named or told:
                out.append((where, parser, action))
    return out


FLAGS = bandwidth_flags()


def test_the_bandwidth_flags_are_found():
    assert {(where, a.option_strings[0]) for where, _, a in FLAGS} == KNOWN


@pytest.mark.parametrize("where,parser,action", FLAGS, ids=[f"{w} {a.option_strings[0]}" for w, _, a in FLAGS])
def test_every_bandwidth_flag_reads_the_one_rule(where, parser, action):
    assert isinstance(action.type, BandwidthFlag), f"{where} {action.option_strings[0]} parses its own bandwidth"
    flag = action.option_strings[0]

    def parsed(text):
        value = getattr(parser.parse_args([flag, text]), action.dest)
        return value.bandwidth if isinstance(value, Link) else value

    plain, typed, bits = parsed("5"), parsed("5GB/s"), parsed("40Gbit/s")
    assert isinstance(plain, Bandwidth) and plain.bytes_per_s == typed.bytes_per_s == bits.bytes_per_s == 5e9
    assert (str(plain), str(bits)) == ("5 GB/s", "40 Gbit/s")            # echoed in the unit typed
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([flag, "40Gb/s"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("argv", [["--nic-bw", "40Gb/s"], ["--nvlink-bw", "50G"]])
def test_an_ambiguous_unit_is_one_line_naming_the_units(argv, capsys):
    assert cli.main(["simulate", "collective", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "argument" not in err
    assert err.startswith(f"ringzero: error: {argv[0]}='{argv[1]}': unknown or ambiguous unit")
    assert "GB/s (also a plain number)" in err and "Gbit/s" in err


def _json(argv, capsys) -> dict:
    assert cli.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_plain_number_is_gb_per_s_in_simulate_and_echoed(capsys):
    """The issue: `--nic-bw 5` was 5 bytes/s, a 1 MiB all-reduce of 7.3 hours."""
    base = ["simulate", "collective", "--gpus", "16", "--algorithm", "ring", "--sizes", "1M"]
    plain = _json([*base, "--nic-bw", "5"], capsys)["rows"][0]
    assert plain == _json([*base, "--nic-bw", "40Gbit/s"], capsys)["rows"][0]
    assert plain["time_us"] < 1e4
    assert cli.main([*base, "--nic-bw", "40Gbit/s"]) == 0
    assert "--nic-bw 40 Gbit/s" in capsys.readouterr().out


def test_a_plain_number_is_gb_per_s_in_simulate_step_and_plan(capsys):
    """The issue: `simulate step --inter-bw 5` was a 72-day step."""
    step = ["simulate", "step", "--model", "llama-2-7b", "--gpus", "16", "--zero", "1"]
    plain = _json([*step, "--inter-bw", "5"], capsys)
    assert plain["step_s"] == _json([*step, "--inter-bw", "5GB/s"], capsys)["step_s"] < 100
    plan = ["plan", "--model", "llama-2-7b", "--gpus", "16"]
    assert _json([*plan, "--inter-bw", "5"], capsys) == _json([*plan, "--inter-bw", "40Gbit/s"], capsys)
    assert cli.main([*plan, "--inter-bw", "40Gbit/s"]) == 0
    assert "network 40 Gbit/s per GPU" in capsys.readouterr().out


def test_train_takes_the_emulated_link_in_any_unit():
    from ringzero.commands import train, train_args
    parser = cli.build_parser(only="train")
    args = parser.parse_args(["train", "--emulate-inter-node", "10Gbit/s,20"])
    assert train_args.given(args, train.FLAGS)["emulate_inter_node"] == (1.25, 20.0)
    assert train_args.emulated(args) == ", cross-node messages over an emulated 10 Gbit/s, 20 µs per message link"
    plain = parser.parse_args(["train", "--emulate-inter-node", "0.05"])
    assert train_args.given(plain, train.FLAGS)["emulate_inter_node"] == (0.05, 0.0)
