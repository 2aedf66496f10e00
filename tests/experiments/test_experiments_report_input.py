"""Hostile input to `experiments report` / `experiments run`: every bad results file or output path is one
message naming it (exit 2) before anything is written; a number that is not finite never becomes a verdict."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.experiments_fixtures import baselines, history, trained
from helpers.paths import REPO_ROOT

from experiments.cli import main
from experiments.results import write_results

ROOT = REPO_ROOT


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A valid results folder: baselines and a budgeted run."""
    out = tmp_path / "results"
    write_results(out / "baselines.json", baselines())
    write_results(out / "gspo_b25.json", trained("gspo_b25", 0.3, 20_000, history([100.0, 98.0, 101.0]),
                                                 budget_target=100.0))
    return out


def _report(capsys, results: Path | str, out: Path | str, *extra: str) -> tuple[int, str]:
    rc = main(["report", "--params", str(ROOT / "params.yaml"), "--results", str(results),
               "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return rc, err


def _edit(path: Path, change) -> None:
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize(("change", "expected"), [
    (lambda r: r["history"][-1].update({"train/budget_tokens": float("nan")}), "history.2.train/budget_tokens"),
    (lambda r: r["budget"].update({"target": float("inf")}), "budget.target"),
    (lambda r: r["budget"].update({"target": 50.0}), "target 50.0 is not fraction x baseline_mean"),
    (lambda r: r["eval"]["agent_gspo"]["gsm8k"].update({"accuracy": float("nan")}), "accuracy"),
    (lambda r: r.update({"seed": True}), "seed: Input should be a valid integer"),
    (lambda r: r["summary"]["agent_gspo"].update({"n": -3}), "summary.agent_gspo.n: must be a finite number >= 0"),
    (lambda r: r["summary"]["agent_gspo"].update({"accuracy": "high"}), "summary.agent_gspo.accuracy"),
    (lambda r: r.update({"eval": {}}), "eval: no evaluated system"),
    (lambda r: r.update({"history": []}), "history: empty"),
])
def test_a_results_file_that_lies_is_refused_by_key(folder, tmp_path, capsys, change, expected):
    """Was: NaN tokens became a FAIL ("nan vs B"), an infinite B a -100 % miss, an emptied eval or history
    read as NOT RUN, a NaN summary overwrote the report and then crashed writing the metrics."""
    _edit(folder / "gspo_b25.json", change)
    out = tmp_path / "docs" / "results.md"
    rc, err = _report(capsys, folder, out, "--metrics", str(tmp_path / "m.json"))
    assert rc == 2 and str(folder / "gspo_b25.json") in err and expected in err, err
    assert not out.parent.exists() and not (tmp_path / "m.json").exists()  # nothing written, not even a PNG


def test_unreadable_results_files_are_named(folder, tmp_path, capsys):
    cases = {"x.json": lambda p: p.mkdir(),
             "latin.json": lambda p: p.write_bytes(b'{"name": "\xff"}'),
             "deep.json": lambda p: p.write_text("[" * 100_000 + "]" * 100_000)}
    for name, make in cases.items():
        path = folder / name
        make(path)
        rc, err = _report(capsys, folder, tmp_path / "r.md")
        assert rc == 2 and str(path) in err, (name, err)
        path.rmdir() if path.is_dir() else path.unlink()
    os.symlink(folder / "b.json", folder / "a.json")
    os.symlink(folder / "a.json", folder / "b.json")
    rc, err = _report(capsys, folder, tmp_path / "r.md")
    assert rc == 2 and "cannot read the results file" in err, err
    assert not (tmp_path / "r.md").exists()


def test_proof_files_are_name_checked(folder, tmp_path, capsys):
    proof = json.loads((ROOT / "results" / "silence_proof.json").read_text())
    (folder / "other_proof.json").write_text(json.dumps(proof))
    rc, err = _report(capsys, folder, tmp_path / "r.md")
    assert rc == 2 and "name 'silence_proof' does not match the file name 'other_proof'" in err, err


def test_output_paths_are_checked_before_anything_is_written(folder, tmp_path, capsys):
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out, expected in ((a_dir, "is a folder, not a file"), (a_file / "r.md", "is not a folder"),
                          ("", "--out: empty path")):
        rc, err = _report(capsys, folder, out)
        assert rc == 2 and expected in err, (out, err)
    assert list(a_dir.iterdir()) == []  # the PNGs used to land there before the markdown failed
    rc, err = _report(capsys, folder, tmp_path / "r.md", "--metrics", str(a_dir))
    assert rc == 2 and "metrics file (--metrics)" in err and not (tmp_path / "r.md").exists(), err
    rc, err = _report(capsys, "", tmp_path / "r.md")
    assert rc == 2 and "--results: empty path" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, err = _report(capsys, empty, tmp_path / "r.md")
    assert rc == 2 and "no <experiment>.json results files" in err and not (tmp_path / "r.md").exists()


def test_the_same_folder_spelled_two_ways_gives_one_report(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(folder.parent)
    assert _report(capsys, "results", "one.md")[0] == 0
    assert _report(capsys, "./results", "./two.md")[0] == 0
    one, two = (folder.parent / "one.md").read_text(), (folder.parent / "two.md").read_text()
    assert one.replace("one.md", "X").replace("one/", "X/") == two.replace("two.md", "X").replace("two/", "X/")


def test_experiments_run_checks_its_results_folder_before_any_work(tmp_path, capsys, monkeypatch):
    import experiments.runner as runner_mod

    monkeypatch.setattr(runner_mod, "run_one", lambda *a, **k: pytest.fail("work started"))
    a_file = tmp_path / "afile"
    a_file.write_text("hi")
    rc = main(["run", "--params", str(ROOT / "params.yaml"), "--only", "gspo_b25", "--results",
               str(a_file), "--no-track"])
    err = capsys.readouterr().err
    assert rc == 2 and f"results folder (--results / experiments.results_dir) {a_file}: exists and is not a folder" \
        in err, err
