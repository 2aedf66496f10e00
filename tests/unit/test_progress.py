"""The one progress mechanism (components/progress.py): throttled, nested, with counts and time left,
through logging onto stderr only."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.paths import load_test_module

from components.progress import INTERVAL_ENV, Pace, Progress, leaf, report

humaneval_rows = load_test_module("test_data_robustness").humaneval_rows
multiarith_items = load_test_module("test_data_robustness").multiarith_items
write_mirror = load_test_module("test_data_robustness").write_mirror


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO, logger="components.progress")
    return caplog


def test_a_line_at_most_every_interval_with_counts_elapsed_and_time_left(log) -> None:
    clock = Clock()
    with report("evaluate", 10, "batches", Pace(20, clock)) as p:
        for _ in range(10):
            clock.t += 7  # one batch every 7 s: a line at 21 s, 42 s, 63 s (each >= 20 s after the last)
            p.advance(detail="x items")
    lines = log.messages
    assert len(lines) == 3, lines
    assert lines[0] == "evaluate 3/10 batches (x items); 21 s elapsed, ~49 s left (evaluate)"
    assert lines[1].startswith("evaluate 6/10 batches") and "~28 s left" in lines[1]


def test_nested_reports_share_one_throttle_and_write_one_line(log) -> None:
    clock = Clock()
    with report("train", 2, "steps", Pace(20, clock)) as steps:
        with report("rollout", 4, "calls") as calls:
            calls.detail = "4 episodes"
            for _ in range(4):
                decode = leaf("decode", 10, "tokens")
                for _ in range(10):
                    clock.t += 1
                    decode.advance()
                calls.advance()
        steps.advance(shown=True)  # the caller printed its step line: the interval restarts
        update = leaf("update", 2, "mini-batches")
        clock.t += 19
        update.advance()
    lines = log.messages
    assert len(lines) == 2, lines  # at 20 s and 40 s; none right after the step line
    assert lines[0].startswith("train 0/2 steps > rollout 1/4 calls (4 episodes) > decode 10/10 tokens; 20 s elapsed")
    # the open unit counts: rollout 2/4 done at 40 s -> 40 s left; train 1/2 of a step of ~80 s
    assert lines[1].startswith("train 0/2 steps > rollout 3/4 calls")
    assert "left (rollout)" in lines[1] and "left (train)" in lines[1]


def test_time_left_counts_the_open_unit() -> None:
    clock = Clock()
    outer = Progress("train", 2, "steps", pace=Pace(1e9, clock))
    with outer.active():
        inner = leaf("rollout", 4, "calls")
        inner.advance(2)
    clock.t += 50  # half of the first of two steps in 50 s: 150 s left
    assert outer.fraction() == pytest.approx(0.25)
    assert inner.line() == ("train 0/2 steps > rollout 2/4 calls; 50 s elapsed, ~50 s left (rollout), "
                            "~2 min 30 s left (train)")


def test_interval_from_the_environment(monkeypatch) -> None:
    from components.errors import UserError

    monkeypatch.setenv(INTERVAL_ENV, "0")
    assert Progress("x", 1, "u").interval_s == 0
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(UserError, match=INTERVAL_ENV):
        Progress("x", 1, "u")


def test_cli_progress_lines_go_to_stderr_only(tmp_path: Path, capsys, monkeypatch) -> None:
    from components.cli import main

    monkeypatch.setenv(INTERVAL_ENV, "0")
    mirror = write_mirror(tmp_path / "mirror", multiarith_items(), humaneval_rows())
    assert main(["prepare", "--mirror", str(mirror), "--benchmarks", "multiarith,humaneval", "--out",
                 str(tmp_path / "out"), "--no-validate", "--set", f"data.report_dir={tmp_path / 'reports'}",
                 "--set", "data.use_hub=false"]) == 0
    out, err = capsys.readouterr()
    assert "prepare 1/4 steps (now: check humaneval)" in err
    assert "prepare 3/4 steps (now: write humaneval)" in err
    assert "steps" not in out and "prepared 2 benchmark(s)" in out
