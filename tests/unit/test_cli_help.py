"""The CLI says what it is: --version, help text on every option, the exit codes in every --help."""

from __future__ import annotations

import argparse

import pytest

from components.cli import COMMANDS, main
from components.cli_parser import EXIT_CODES, build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "agent-gspo"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_of_every_command_has_help() -> None:
    missing = [f"{path}: {'/'.join(a.option_strings) or a.dest}"
               for path, p in _parsers(build_parser()) for a in p._actions
               if not a.help or a.help == argparse.SUPPRESS]
    assert not missing, f"options without help text: {missing}"


def test_every_command_help_names_the_exit_codes() -> None:
    parsers = dict(_parsers(build_parser()))
    assert set(COMMANDS) <= {path.split()[1] for path in parsers if " " in path}
    for path, p in parsers.items():
        text = p.format_help()
        for code in ("0 ", "1 ", "2 ", "130", "143"):
            assert f"  {code}" in text, f"{path} --help does not name exit code {code}"
    assert "exit codes:" in EXIT_CODES


def test_version_prints_package_version_and_commit(capsys) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"agent-gspo {version('agent-gspo')}")
    assert "(git " in out  # the tests run from a git checkout
