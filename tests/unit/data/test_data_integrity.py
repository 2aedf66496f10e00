"""Tampered, oversize and malformed prepared data is refused, not used (docs/data.md).

Every reader checks a prepared parquet file against the sha256 the manifest records for it
(validate, evaluate, the training data loader: all refuse a flipped gold answer and an "all
answers 0" rewrite); sizes above ``data.max_*_chars`` and cells that are not UTF-8 are one-line
errors naming the file and row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.prepared import record_in_manifest, write_prepared

import components.io as io
from components.cli import main
from components.config import Config
from components.data.expectations import validate, validate_frame
from components.data.integrity import DataIntegrityError, TextLimits
from components.data.prepare import PARQUET_SCHEMA, load_split, records_to_table
from components.data.spec import DataError, DataValidationError
from components.data.train_items import load_train_items

FIX = "re-run `agent-gspo prepare --benchmarks gsm8k`"


@pytest.fixture
def data(prepared_data: Path, tmp_path: Path) -> Path:
    """A private copy of the prepared GSM8K files and the manifest (the session's stay untouched)."""
    out = tmp_path / "data"
    shutil.copytree(prepared_data / "gsm8k", out / "gsm8k")
    shutil.copy(prepared_data / "manifest.json", out / "manifest.json")
    return out


def _rewrite(data: Path, split: str, change) -> Path:
    """Rewrite one prepared file through ``change(rows)``, keeping the manifest (tampering)."""
    rows = [it.to_record() for it in load_split(data, "gsm8k", split)]
    change(rows)
    path = data / "gsm8k" / f"{split}.parquet"
    pq.write_table(records_to_table(rows), path)
    return path


def _flip_one(rows: list[dict]) -> None:
    rows[5]["answer"] = str(int(rows[5]["answer"]) + 1)


def _all_zero(rows: list[dict]) -> None:
    for row in rows:
        row["answer"] = "0"


def _evaluate(data: Path, tmp_path: Path) -> int:
    return main(["evaluate", "--no-track", "--limit", "2", "--baselines", "", "--out", str(tmp_path / "eval"),
                 "--set", f"data.out_dir={data}", "--set", "eval.benchmarks=[gsm8k]"])


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line on stderr (progress log lines aside), no traceback."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.mark.parametrize("split, change", [("test", _flip_one), ("train", _all_zero)])
def test_tampered_file_is_refused_by_every_reader(data: Path, tmp_path: Path, capsys, split, change) -> None:
    path = _rewrite(data, split, change)
    message = rf"^{path}: content sha256 [0-9a-f]{{12}}\.\.\. differs from the [0-9a-f]{{12}}\.\.\. that "
    with pytest.raises(DataIntegrityError, match=message + rf".*; {FIX.replace('`', '.')}$"):
        load_split(data, "gsm8k", split)
    # the training data loader
    cfg = Config.model_validate({"data": {"out_dir": str(data), "train_sources": [f"gsm8k/{split}"]},
                                 "eval": {"benchmarks": ["gsm8k"]}})
    with pytest.raises(DataIntegrityError, match=message):
        load_train_items(cfg)
    # validate: exit 2, one line naming the file; the report lists it
    report = tmp_path / "r" / "validation.md"
    assert main(["validate", "--data", str(data), "--set", f"data.report_dir={report.parent}",
                 "--set", "data.benchmarks=[gsm8k]"]) == 2
    err = _one_line(capsys)
    assert str(path) in err and FIX in err and "differs from the" in err
    assert "file_matches_manifest" in report.read_text()
    with pytest.raises(DataValidationError) as err:  # the flow posts a failed validation's report
        validate(data, report, ["gsm8k"])
    assert isinstance(err.value, DataIntegrityError) and err.value.report == report.read_text()
    if split == "test":  # evaluate (it reads the test split): exit 2 before any model loads, one line
        assert _evaluate(data, tmp_path) == 2
        err = _one_line(capsys)
        assert str(path) in err and FIX in err and not (tmp_path / "eval").exists()


def test_the_untouched_copy_passes_and_is_hashed_once_per_file(data: Path, monkeypatch) -> None:
    calls = []
    real = io.hashlib.sha256
    monkeypatch.setattr(io.hashlib, "sha256", lambda *a: calls.append(1) or real(*a))
    io._MATCHED.clear()
    first = load_split(data, "gsm8k", "test")
    again = load_split(data, "gsm8k", "test")
    assert [i.id for i in first] == [i.id for i in again] and len(first) == 1319 and len(calls) == 1  # cached


def test_an_older_manifest_without_content_hashes_says_to_re_run_prepare(data: Path) -> None:
    manifest = json.loads((data / "manifest.json").read_text())
    del manifest["benchmarks"]["gsm8k"]["output_sha256"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataIntegrityError, match=r"records no content sha256 for gsm8k/test\.parquet \(a manifest "
                                                 r"from an older prepare\); re-run `agent-gspo prepare"):
        load_split(data, "gsm8k", "test")
    (data / "manifest.json").unlink()
    with pytest.raises(DataIntegrityError, match=r"manifest\.json: not found.*re-run `agent-gspo prepare"):
        load_split(data, "gsm8k", "test")


# ---------------------------------------------------------------------------------- size limits


def _row(i: int, question: str = "", answer: str = "2", choices=None) -> dict:
    return {"id": f"gsm8k/test/{i}", "benchmark": "gsm8k", "split": "test", "question": question or f"{i}+1?",
            "choices": choices, "answer": answer, "answer_type": "numeric", "meta": "{}"}


def test_validate_frame_names_row_id_and_field_above_the_limits() -> None:
    import pandas as pd

    limits = TextLimits(question=50, choice=10, answer=5)
    rows = [_row(i) for i in range(1319)]
    rows[7]["question"] = "x" * 51
    rows[9]["answer"] = "123456"
    res = validate_frame("gsm8k", "test", pd.DataFrame(rows), limits, "data/gsm8k/test.parquet")
    failures = {f["column"]: f for f in res.failures}
    assert set(failures) == {"question", "answer"}, res.failures
    assert failures["question"]["example_rows"] == ["gsm8k/test/7"]
    assert "above data.max_question_chars=50 characters (longest 51)" in failures["question"]["observed"]
    assert failures["answer"]["example_rows"] == ["gsm8k/test/9"]
    choice = [{**_row(i, answer="A", choices=["a", "b", "c", "d"]), "id": f"mmlu/dev/{i}", "benchmark": "mmlu",
               "split": "dev", "answer_type": "choice", "question": f"q{i}"} for i in range(285)]
    choice[3]["choices"] = ["a", "b", "c" * 11, "d"]
    res = validate_frame("mmlu", "dev", pd.DataFrame(choice), limits)
    (failure,) = res.failures
    assert failure["column"] == "longest_choice_chars" and failure["example_rows"] == ["mmlu/dev/3"]
    assert "data.max_choice_chars=10" in failure["observed"]


def test_every_real_item_fits_the_default_limits(prepared_data: Path) -> None:
    """The defaults hold every prepared item (the largest: MMLU questions and options, HumanEval answers)."""
    from components.config import ALL_BENCHMARKS
    from components.data.integrity import oversize, read_checked
    from components.data.spec import get_spec

    for name in ALL_BENCHMARKS:
        for split in get_spec(name).expected:
            assert oversize(read_checked(prepared_data, name, split), TextLimits.of()) == [], (name, split)


def test_a_50_mb_question_is_refused_before_any_item_is_built(data: Path, tmp_path: Path, capsys) -> None:
    rows = [it.to_record() for it in load_split(data, "gsm8k", "test")]
    rows[3]["question"] = "7 " * 25_000_000
    path = write_prepared(data, "gsm8k", "test", records_to_table(rows))
    with pytest.raises(DataError, match=rf"^{path}: row 3 \(id gsm8k/test/3\): 'question' has 50000000 characters, "
                                        r"above data.max_question_chars=16000"):
        load_split(data, "gsm8k", "test")
    report = tmp_path / "r" / "validation.md"
    with pytest.raises(DataValidationError, match="data validation failed for gsm8k/test"):
        validate(data, report, ["gsm8k"])
    text = report.read_text()
    assert f"## gsm8k / test ({path})" in text and "example rows: gsm8k/test/3" in text
    assert "above data.max_question_chars=16000 characters (longest 50000000)" in text and len(text) < 10_000
    assert _evaluate(data, tmp_path) == 2
    err = _one_line(capsys)
    assert str(path) in err and "row 3" in err and "data.max_question_chars" in err


# ---------------------------------------------------------------------------------- bad UTF-8


def _bad_utf8_table(rows: list[dict], row: int) -> pa.Table:
    table = records_to_table(rows)
    cells = table.column("question").combine_chunks().view(pa.binary()).to_pylist()
    cells[row] = cells[row][:5] + b"\xff\xfe" + cells[row][5:]
    column = pa.array(cells, pa.binary()).view(pa.string())
    return pa.Table.from_arrays([column if n == "question" else table.column(n) for n in table.column_names],
                                schema=PARQUET_SCHEMA)


def test_a_question_that_is_not_utf8_is_one_line_naming_file_and_row(data: Path, tmp_path: Path, capsys) -> None:
    rows = [it.to_record() for it in load_split(data, "gsm8k", "test")]
    path = write_prepared(data, "gsm8k", "test", _bad_utf8_table(rows, 1000))  # its sha256 recorded: not tampering
    with pytest.raises(DataError, match=rf"^{path}: row 1000 \(id gsm8k/test/1000\): column 'question' is not UTF-8"):
        load_split(data, "gsm8k", "test")
    assert main(["validate", "--data", str(data), "--set", f"data.report_dir={tmp_path / 'r'}",
                 "--set", "data.benchmarks=[gsm8k]"]) == 2
    err = _one_line(capsys)
    assert str(path) in err and "row 1000" in err
    assert _evaluate(data, tmp_path) == 2
    err = _one_line(capsys)
    assert str(path) in err and "row 1000" in err


def test_record_in_manifest_helper_matches_prepare(data: Path) -> None:
    """The tests' helper records what prepare records (else the tests above would test nothing)."""
    before = json.loads((data / "manifest.json").read_text())["benchmarks"]["gsm8k"]["output_sha256"]
    record_in_manifest(data, "gsm8k", "test")
    after = json.loads((data / "manifest.json").read_text())["benchmarks"]["gsm8k"]["output_sha256"]
    assert before == after


def test_a_mirror_line_that_is_not_utf8_is_named_exactly(tmp_path: Path, capsys) -> None:
    """prepare: exit 2 naming the file and the line of the bad byte (a text-mode reader decoded ahead in
    blocks and named a line up to a block earlier: 625 for a byte on line 701)."""
    from conftest import MIRROR

    from components.data.readers import read_json_array

    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR}")
    mirror = tmp_path / "mirror"
    shutil.copytree(MIRROR / "gsm8k", mirror / "gsm8k")
    path = mirror / "gsm8k" / "test.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[700] = lines[700].replace(b"?", b"?\xff", 1)
    path.write_bytes(b"\n".join(lines))
    assert main(["prepare", "--benchmarks", "gsm8k", "--mirror", str(mirror), "--out", str(tmp_path / "out"),
                 "--no-validate", "--set", "data.use_hub=false", "--set", f"data.report_dir={tmp_path}"]) == 2
    assert f"{path}:701: not UTF-8" in _one_line(capsys)
    array = tmp_path / "MultiArith.json"
    array.write_bytes(b'[\n{"sQuestion": "a"},\n{"sQuestion": "b\xff"}\n]')
    with pytest.raises(DataError, match=rf"^multiarith: {array}:3: not UTF-8"):
        read_json_array(array, "multiarith")
