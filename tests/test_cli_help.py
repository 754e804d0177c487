"""Every option of every ringzero command says what it does: a walk over the parsers the real
command line builds (so a new flag is covered the day it is added), where no help line is only a
default, and each says something of substance."""

from __future__ import annotations

import argparse
import re

import pytest

from ringzero import cli

DEFAULT = re.compile(r"\(?\bdefaults?\b:?[^;()]*\)?", re.IGNORECASE)
"""A "default: X" / "(default 4)" clause, what a help line says besides what the option does."""
WORD = re.compile(r"[^\W\d_]{2,}")


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    """(command path, parser) of `parser` and of every sub-command under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


def options() -> list[tuple[str, str, str | None]]:
    """(command, option, help) of every option and positional of every command, each command's
    parser built as `ringzero COMMAND` builds it (its module's options added)."""
    out = []
    for command in cli.COMMANDS:
        for path, parser in _parsers(cli.build_parser(command), ()):
            if not path or path[0] != command:
                continue
            for action in parser._actions:
                if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                    continue
                name = "/".join(action.option_strings) or action.dest
                out.append((" ".join(path), name, action.help))
    return out


ALL = options()


def test_the_walk_reaches_every_command_and_their_options():
    commands = {c for c, _, _ in ALL}
    assert {"train", "plan", "bench comm", "bench train", "bench ps", "explain", "checkpoint inspect",
            "checkpoint consolidate", "analyze", "simulate collective", "simulate step"} <= commands
    assert len([o for c, o, _ in ALL if c == "train"]) > 70


@pytest.mark.parametrize("command, option, text", ALL, ids=[f"{c}:{o}" for c, o, _ in ALL])
def test_every_option_says_what_it_does(command, option, text):
    assert text and text != argparse.SUPPRESS, f"ringzero {command} {option} has no help"
    said = DEFAULT.sub(" ", text % {"prog": "ringzero"} if "%(" in text else text)
    assert len(WORD.findall(said)) >= 3, f"ringzero {command} {option}: {text!r} says only its default"
