"""The grader's dispatch, batch ordering and the predictions-file scorer (agent-gspo score)."""

import json
import os
from pathlib import Path

import pytest
from helpers import grade_rows, grade_text

from components.data.item import as_items
from components.errors import UserError
from components.scoring import ScoreResult, ScoringError, score_predictions_file

RECORDS = [
    {"id": "gsm8k/test/0", "benchmark": "gsm8k", "split": "test", "question": "q", "choices": None,
     "answer": "1450000", "answer_type": "numeric", "meta": {}},
    {"id": "aqua/test/0", "benchmark": "aqua", "split": "test", "question": "q",
     "choices": ["A)1", "B)2", "C)3", "D)4", "E)5"], "answer": "C", "answer_type": "choice", "meta": "{}"},
    {"id": "math500/0", "benchmark": "math500", "split": "test", "question": "q", "choices": None,
     "answer": "\\frac{1}{2}", "answer_type": "math", "meta": {"level": 1}},
    {"id": "humaneval/0", "benchmark": "humaneval", "split": "test", "question": "q", "choices": None,
     "answer": "", "answer_type": "code",
     "meta": {"prompt": "def f(x):\n", "test": "def check(c):\n    assert c(2) == 4\n", "entry_point": "f"}},
]


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_unknown_answer_type() -> None:
    with pytest.raises(UserError, match="unknown answer_type 'essay'"):
        grade_text("essay", "x", "y")


def test_score_result_is_frozen() -> None:
    res = ScoreResult(True, "1", None)
    with pytest.raises(AttributeError):
        res.correct = False  # type: ignore[misc]


def test_score_many_keeps_order() -> None:
    items = [("numeric", f"The answer is {i}", str(i if i % 2 else i + 1), {}) for i in range(10)]
    items.insert(3, ("math", "\\boxed{0.5}", "\\frac12", {}))
    results = grade_rows(items, workers=2)
    assert [r.correct for r in results] == [False, True, False, True, True, False, True, False, True, False, True]


def test_predictions_file_end_to_end(tmp_path: Path) -> None:
    preds = _write(tmp_path / "p.jsonl", [
        {"id": "gsm8k/test/0", "prediction": "So she earns $1,450,000 in total.\n#### 1,450,000"},
        {"id": "aqua/test/0", "prediction": "The answer is (B)"},
        "",
        {"id": "math500/0", "prediction": "Hence $\\boxed{0.5}$."},
        {"id": "humaneval/0", "prediction": "    return x * 2\n"},
    ])
    out = tmp_path / "out" / "scores.jsonl"
    summary = score_predictions_file(as_items(RECORDS), preds, out)
    assert summary == {"n": 4, "n_records": 4, "coverage": 1.0, "correct": 3, "accuracy": 0.75,
                       "accuracy_on_submitted": 0.75, "errors": 0, "n_missing": 0, "missing_ids": [],
                       "unknown_ids": []}
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["gsm8k/test/0", "aqua/test/0", "math500/0", "humaneval/0"]
    assert lines[0] == {"id": "gsm8k/test/0", "correct": True, "extracted": "1450000", "error": None}
    assert lines[1]["extracted"] == "B" and not lines[1]["correct"]
    assert lines[3]["correct"] and lines[3]["extracted"] == "passed"


def test_missing_ids_and_no_output(tmp_path: Path) -> None:
    preds = _write(tmp_path / "p.jsonl", [{"id": "aqua/test/0", "prediction": "C"}])
    summary = score_predictions_file(as_items(RECORDS), preds, None)
    assert summary["n"] == 1 and summary["correct"] == 1
    assert summary["missing_ids"] == ["gsm8k/test/0", "math500/0", "humaneval/0"]
    assert summary["n_missing"] == 3


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    preds = _write(tmp_path / "p.jsonl", [{"id": "aqua/test/0", "prediction": "C"}, '{"id": "x", pred'])
    with pytest.raises(ScoringError, match=r"p\.jsonl:2: malformed JSON"):
        score_predictions_file(as_items(RECORDS), preds, tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()


def test_missing_keys_and_unknown_ids(tmp_path: Path) -> None:
    preds = _write(tmp_path / "p.jsonl", [{"id": "aqua/test/0"}])
    with pytest.raises(ScoringError, match=r"p\.jsonl:1: expected an object"):
        score_predictions_file(as_items(RECORDS), preds, None)
    preds = _write(tmp_path / "q.jsonl", [{"id": "nope/1", "prediction": "1"}, {"id": "nope/2", "prediction": ""}])
    with pytest.raises(ScoringError, match="nope/1, nope/2"):
        score_predictions_file(as_items(RECORDS), preds, None)
    preds = _write(tmp_path / "r.jsonl", [{"id": "aqua/test/0", "prediction": "C"}] * 2)
    with pytest.raises(ScoringError, match=r"r\.jsonl:2: duplicate id"):
        score_predictions_file(as_items(RECORDS), preds, None)
    with pytest.raises(ScoringError, match="does not exist"):
        score_predictions_file(as_items(RECORDS), tmp_path / "absent.jsonl", None)


def test_code_record_without_test_is_user_error() -> None:
    with pytest.raises(ScoringError, match="meta lacks test"):
        grade_text("code", "    return 1\n", "", {"prompt": "def f():\n", "entry_point": "f"})


@pytest.mark.parametrize("line", [
    '{"id": "aqua/test/0", "prediction": "A", "prediction": "C"}',
    '{"id": "aqua/test/0", "id": "gsm8k/test/0", "prediction": "C"}',
    '{"id": "aqua/test/0", "prediction": "C", "extra": {"k": 1, "k": 2}}',
])
def test_repeated_key_is_refused_with_file_and_line(tmp_path: Path, line: str) -> None:
    """``json`` keeps the last of two equal keys silently; which answer was meant is unknowable."""
    preds = _write(tmp_path / "p.jsonl", [{"id": "gsm8k/test/0", "prediction": "1"}, line])
    with pytest.raises(ScoringError, match=r"p\.jsonl:2: repeated key '(prediction|id|k)'"):
        score_predictions_file(as_items(RECORDS), preds, tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("how", ["same", "spelled", "symlink", "hardlink"])
def test_out_that_is_the_predictions_file_is_refused(tmp_path: Path, how: str) -> None:
    """Writing the results over the predictions would destroy the user's only copy of them."""
    preds = _write(tmp_path / "p.jsonl", [{"id": "aqua/test/0", "prediction": "C"}])
    before = preds.read_bytes()
    out = {"same": preds, "spelled": tmp_path / "sub" / ".." / "p.jsonl", "symlink": tmp_path / "link.jsonl",
           "hardlink": tmp_path / "hard.jsonl"}[how]
    if how == "spelled":
        (tmp_path / "sub").mkdir()
    elif how == "symlink":
        out.symlink_to(preds)
    elif how == "hardlink":
        os.link(preds, out)
    with pytest.raises(ScoringError, match="is the predictions file"):
        score_predictions_file(as_items(RECORDS), preds, out)
    assert preds.read_bytes() == before


def test_out_beside_the_predictions_is_fine(tmp_path: Path) -> None:
    preds = _write(tmp_path / "p.jsonl", [{"id": "aqua/test/0", "prediction": "C"}])
    (tmp_path / "o.jsonl").write_text("old results\n")  # an existing, different --out is overwritten
    summary = score_predictions_file(as_items(RECORDS), preds, tmp_path / "o.jsonl")
    assert summary["correct"] == 1 and json.loads((tmp_path / "o.jsonl").read_text())["correct"]
