"""argparse's own usage errors, as a user meets them (the command run as a process): an unknown command or
option, a missing argument or value, a value not among the choices or of the wrong type, no command at all.
Each is one line on stderr naming what is wrong and pointing to ``--help``, exit 2, nothing on stdout and
nothing written; ``--help`` still prints the usage and exits 0. Before
:class:`components.errors.OneLineParser` each printed argparse's usage block (up to 10 lines) first."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.cli_parser import build_parser
from components.errors import MAX_USAGE_ERROR, OneLineParser

CLI = ["-m", "components.cli"]
HUGE = "9" * 100_000


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), AGENT_GSPO_PROFILE="")
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def _one_line_usage_error(args: list[str], cwd: Path, prog: str) -> str:
    done = _run(args, cwd)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"{prog}: error: ") and lines[0].endswith(f" (see {prog} --help)"), lines[0]
    assert "usage:" not in done.stderr and done.stdout == ""
    assert not list(cwd.iterdir()), "a usage error wrote something"
    return lines[0]


@pytest.mark.parametrize(("argv", "prog", "named"), [
    ([], "agent-gspo", "COMMAND"),  # no command at all
    (["bogus"], "agent-gspo", "'bogus'"),  # unknown command
    (["train", "--bogus"], "agent-gspo train", "unrecognized arguments: --bogus"),
    (["--bogus", "train"], "agent-gspo train", "unrecognized arguments: --bogus"),
    (["config", "keys", "--bogus"], "agent-gspo config keys", "unrecognized arguments: --bogus"),
    (["config"], "agent-gspo config", "ACTION"),  # missing sub-command
    (["config", "nope"], "agent-gspo config", "'nope'"),
    (["rollout"], "agent-gspo rollout", "--benchmark"),  # missing required option
    (["train", "--profile"], "agent-gspo train", "--profile"),  # option without its value
    (["rollout", "--benchmark", "nope"], "agent-gspo rollout", "'nope'"),  # invalid choice
    (["evaluate", "--split", "nope"], "agent-gspo evaluate", "'nope'"),
    (["train", "--max-steps", "abc"], "agent-gspo train", "'abc'"),  # bad type (the project's own)
    (["search", "--budget-tokens", "x"], "agent-gspo search", "'x'"),  # bad type (argparse's int)
], ids=["no-command", "unknown-command", "unknown-option", "option-before-command", "nested-unknown-option",
        "no-action", "unknown-action", "missing-required", "missing-value", "invalid-choice", "invalid-choice-split",
        "bad-type", "bad-int"])
def test_a_usage_error_is_one_line_naming_the_token(tmp_path: Path, argv: list[str], prog: str, named: str) -> None:
    line = _one_line_usage_error([*CLI, *argv], tmp_path, prog)
    assert named in line, line


def test_an_unknown_profile_is_one_line_too(tmp_path: Path) -> None:
    done = _run([*CLI, "config", "show", "--params", str(REPO_ROOT / "params.yaml"), "--profile", "nope"], tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "nope" in done.stderr, done.stderr


@pytest.mark.parametrize("argv", [["train", "--max-steps", HUGE], ["rollout", "--benchmark", "x" * 100_000],
                                  ["train", *["--zz"] * 5000], ["train", "--bogus=" + "y " * 50_000]],
                         ids=["huge-int", "huge-choice", "many-unknown", "huge-spaced-value"])
def test_long_values_are_clipped(tmp_path: Path, argv: list[str]) -> None:
    line = _one_line_usage_error([*CLI, *argv], tmp_path, f"agent-gspo {argv[0]}")
    assert len(line) < MAX_USAGE_ERROR + 100 and "..." in line, len(line)
    assert "--max-steps" in line or "--benchmark" in line or "unrecognized arguments: --" in line, line[:200]


def test_a_newline_or_a_uri_password_in_a_refused_argument_stays_out(tmp_path: Path) -> None:
    line = _one_line_usage_error([*CLI, "train", "a\nb", "postgresql://u:secret@h/db"], tmp_path, "agent-gspo train")
    assert "a b" in line and "secret" not in line and "postgresql://u:***@h/db" in line, line


@pytest.mark.parametrize(("argv", "prog"), [
    (["-m", "components.search.worker", "--synthetic", "--bogus"], "python -m components.search.worker"),
    (["-m", "experiments", "run", "--bogus"], "agent-gspo experiments run"),
    ([*CLI, "experiments", "report", "--bogus"], "agent-gspo experiments report"),  # forwarded to the study
    (["-m", "components.runtime.train_main", "--bogus"], "agent-gspo-train"),
], ids=["search-worker", "study", "agent-gspo-experiments", "train-main"])
def test_the_other_entry_points_are_one_line_too(tmp_path: Path, argv: list[str], prog: str) -> None:
    assert "--bogus" in _one_line_usage_error(argv, tmp_path, prog)


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["config", "keys", "--help"]])
def test_help_still_prints_the_usage_and_exits_0(tmp_path: Path, argv: list[str]) -> None:
    done = _run([*CLI, *argv], tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"usage: agent-gspo {' '.join(argv[:-1])}".rstrip() + " [-h]"), done.stdout[:200]
    assert "exit codes:" in done.stdout


def test_every_parser_of_the_command_line_is_one_line() -> None:
    def parsers(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    found = list(parsers(build_parser()))
    assert len(found) > 10 and all(isinstance(p, OneLineParser) for p in found)
