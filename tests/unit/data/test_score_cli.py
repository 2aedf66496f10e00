"""`agent-gspo score` end to end through the CLI: the configured limits reach the grader, --out
never replaces the predictions, and the summary stays short whatever the split's size."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.cli import main
from components.data.item import as_items

ROOT = REPO_ROOT

LOOP = {"id": "humaneval/0", "benchmark": "humaneval", "split": "test", "question": "q", "choices": None,
        "answer": "", "answer_type": "code",
        "meta": {"prompt": "def f(x):\n", "test": "def check(c):\n    assert c(2) == 4\n", "entry_point": "f"}}


def _numeric(i: int) -> dict:
    return {"id": f"gsm8k/test/{i}", "benchmark": "gsm8k", "split": "test", "question": "q", "choices": None,
            "answer": str(i), "answer_type": "numeric", "meta": {}}


def _score(monkeypatch: pytest.MonkeyPatch, records: list[dict], argv: list[str]) -> int:
    """Run ``agent-gspo score`` on ``records`` (given as the split, no prepared data needed)."""
    import components.data.prepare as prepare
    import components.evaluation.items as evaluation_items

    split = lambda *a, **k: as_items(records)  # noqa: E731
    monkeypatch.setattr(prepare, "load_split", split)  # `score --benchmark` (imported in the command)
    monkeypatch.setattr(evaluation_items, "load_split", split)  # `score --items` (module-level import)
    return main(["score", "--params", str(ROOT / "params.yaml"), *argv])


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_code_timeout_reaches_the_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``--set eval.code_timeout_s=1``: an endless program is stopped after 1 s, not the default 10."""
    preds = _write(tmp_path / "p.jsonl", [{"id": "humaneval/0", "prediction": "    while True:\n        pass\n"}])
    out = tmp_path / "o.jsonl"
    t0 = time.monotonic()
    code = _score(monkeypatch, [LOOP], ["--benchmark", "humaneval", "--predictions", str(preds), "--out", str(out),
                                        "--set", "eval.code_timeout_s=1"])
    elapsed = time.monotonic() - t0
    assert code == 0
    line = json.loads(out.read_text())
    assert not line["correct"] and line["extracted"].startswith("timeout:") and "limit 1s" in line["extracted"], line
    assert elapsed < 8, elapsed


def test_out_equal_to_predictions_exits_2_and_keeps_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    preds = _write(tmp_path / "p.jsonl", [{"id": "gsm8k/test/1", "prediction": "1"}])
    before = preds.read_bytes()
    code = _score(monkeypatch, [_numeric(1)], ["--benchmark", "gsm8k", "--predictions", str(preds),
                                               "--out", str(tmp_path / "." / "p.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and preds.read_bytes() == before
    assert err.count("\n") == 1 and "is the predictions file" in err and "Traceback" not in err, err


def test_summary_shows_the_first_missing_ids_and_their_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """One prediction against a 1000-record split: 10 ids printed and the count, not 999 lines."""
    records = [_numeric(i) for i in range(1000)]
    preds = _write(tmp_path / "p.jsonl", [{"id": "gsm8k/test/0", "prediction": "0"}])
    code = _score(monkeypatch, records, ["--benchmark", "gsm8k", "--predictions", str(preds)])
    out = capsys.readouterr().out
    summary = json.loads(out)
    assert code == 0 and summary["correct"] == 1 and summary["n_missing"] == 999
    assert summary["missing_ids"] == [f"gsm8k/test/{i}" for i in range(1, 11)]
    assert len(out.splitlines()) < 40


@pytest.mark.parametrize("kind", ["fifo", "under-a-file", "in-the-data-folder"])
def test_an_out_that_cannot_take_the_results_is_refused_before_grading(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path, capsys, kind: str) -> None:
    """Was: a FIFO or device was replaced by a regular file (as root, `--out /dev/null` too), a path under
    a file failed only after the grading ("File exists"), and a prepared split could be overwritten."""
    import os

    import components.scoring as scoring

    graded: list[int] = []
    real = scoring.grade_many
    monkeypatch.setattr(scoring, "grade_many", lambda *a, **k: graded.append(1) or real(*a, **k))
    preds = _write(tmp_path / "p.jsonl", [{"id": "gsm8k/test/1", "prediction": "1"}])
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    gold = data / "gsm8k" / "test.parquet"
    gold.write_bytes(b"PAR1 gold")
    if kind == "fifo":
        out = tmp_path / "fifo"
        os.mkfifo(out)
        expected = "exists and is not a regular file"
    elif kind == "under-a-file":
        out = preds / "x.jsonl"
        expected = "is not a folder"
    else:
        out = gold
        expected = "which holds benchmark data (gold answers)"
    code = _score(monkeypatch, [_numeric(1)], ["--benchmark", "gsm8k", "--data", str(data), "--predictions",
                                               str(preds), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and err.count("\n") == 1, err
    assert not graded and gold.read_bytes() == b"PAR1 gold"
    assert kind != "fifo" or not out.is_file()


def test_predictions_that_are_not_a_regular_file_are_named_as_such(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path, capsys) -> None:
    code = _score(monkeypatch, [_numeric(1)], ["--benchmark", "gsm8k", "--predictions", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"predictions file {tmp_path}: is not a regular file" in err, err


def test_a_number_too_large_for_a_float_is_a_wrong_answer_not_a_crash(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path, capsys) -> None:
    """Was: OverflowError from float() ended the whole run (and would end an evaluation or a training step)."""
    big = "1" + "0" * 400
    preds = _write(tmp_path / "p.jsonl", [{"id": "gsm8k/test/1", "prediction": big},
                                          {"id": "gsm8k/test/2", "prediction": "\\boxed{" + big + "}"}])
    records = [_numeric(1), {**_numeric(2), "answer": big}]
    code = _score(monkeypatch, records, ["--benchmark", "gsm8k", "--predictions", str(preds)])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["correct"] == 1 and summary["errors"] == 0


def test_score_items_regrades_an_evaluation_and_flags_a_changed_grade(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """``score --items``: the per-item record's predictions re-graded by the one grader; a record whose
    ``correct`` was edited is an error naming the file and line (exit 2)."""
    from helpers import gate_helpers as gh

    rows = gh.records([True, False], 10, ids=["gsm8k/test/7", "gsm8k/test/3"])  # predictions "7" and "8"
    split = [_numeric(7), _numeric(3)]
    items = _write(tmp_path / "items.jsonl", rows)
    out = tmp_path / "grades.jsonl"
    assert _score(monkeypatch, split, ["--items", str(items), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["n"], summary["agree"], summary["disagree"]) == (2, 2, 0)
    grades = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(g["id"], g["correct"], g["extracted"]) for g in grades] == [("gsm8k/test/7", True, "7"),
                                                                         ("gsm8k/test/3", False, "8")]
    rows[1]["correct"] = True  # an edited grade
    _write(items, rows)
    assert _score(monkeypatch, split, ["--items", str(items)]) == 2
    err = capsys.readouterr().err
    assert f"{items}, line 2: item 'gsm8k/test/3' of gsm8k (agent_gspo) records correct=True but re-grades to " \
           "False" in err
    assert _score(monkeypatch, split, ["--benchmark", "gsm8k"]) == 2  # neither --predictions nor --items
