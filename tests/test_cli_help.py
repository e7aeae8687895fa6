"""Help that helps: `pacer --help` says what each command is for, and every flag of every
subcommand (as `pacer.cli.main` builds it from `SUBCOMMANDS`) has a one-line help."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import pathlib

import pytest

from pacer.cli.main import SUBCOMMANDS, main

_GEN = pathlib.Path(__file__).resolve().parent.parent / "docs" / "gen_flags.py"


def _gen_flags():
    spec = importlib.util.spec_from_file_location("gen_flags", _GEN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _gen_flags()
PARSERS = GEN.subcommand_parsers()


def test_every_subcommand_is_built():
    """Every command of the table loads here (a room missing its dependencies drops out of
    `pacer --help` silently, so the dev install must have them all)."""
    assert list(PARSERS) == list(SUBCOMMANDS)


def test_pacer_help_says_what_each_command_is_for(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")   # one line per command, so each purpose reads whole
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(out.getvalue().split())
    for name, (_, _, _, purpose) in SUBCOMMANDS.items():
        assert f"{name} {purpose}" in text, f"`pacer --help` does not show {name}'s purpose"


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_flag_has_a_one_line_help(name):
    parser = PARSERS[name]
    formatter = parser._get_formatter()
    missing, multiline = [], []
    for action in GEN.documented_actions(parser):
        flag = "/".join(action.option_strings) or action.dest
        if action.help is None or action.help is argparse.SUPPRESS or not formatter._expand_help(action).strip():
            missing.append(flag)
        elif "\n" in action.help:
            multiline.append(flag)
    assert not missing, f"pacer {name}: flags without help: {missing}"
    assert not multiline, f"pacer {name}: helps longer than one line: {multiline}"


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_each_command_help_renders(name, monkeypatch):
    """`pacer NAME --help` formats every help (a stray `%` in one would raise here, not for a user)."""
    monkeypatch.setenv("COLUMNS", "100")
    text = PARSERS[name].format_help()
    assert text.startswith(f"usage: pacer {name}")
    for action in GEN.documented_actions(PARSERS[name]):
        for flag in action.option_strings:
            assert flag in text
