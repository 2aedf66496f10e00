"""prepare / validate: GX suites catch corrupted mirrors, and failures leave outputs byte-identical."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.paths import REPO_ROOT
from helpers.prepared import record_in_manifest

from components.config import DataConfig
from components.data.expectations import validate, validate_frame
from components.data.prepare import load_manifest, load_split, prepare, prepare_benchmark, records_to_table
from components.data.spec import BENCHMARK_NAMES, DataError, DataValidationError

MIRROR = Path(
    os.environ.get("AGENT_GSPO_DATA_MIRROR")
    or REPO_ROOT / ".." / "shared" / "benchmarks"
)
pytestmark = pytest.mark.skipif(not (MIRROR / "README.md").is_file(), reason=f"no mirror at {MIRROR}")
SMALL = ["gsm8k", "svamp", "aqua", "math500", "humaneval", "multiarith"]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden staging folders included) with file bytes."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared")
    prepare(SMALL, mirror=MIRROR, out_dir=out, progress=False)
    return out


@pytest.fixture
def out_dir(baseline, tmp_path) -> Path:
    dst = tmp_path / "out"
    shutil.copytree(baseline, dst)
    return dst


def corrupt_mirror(tmp_path: Path, sub: str) -> Path:
    """A writable mirror holding a copy of one benchmark folder."""
    mirror = tmp_path / "mirror"
    shutil.copytree(MIRROR / sub, mirror / sub)
    for p in (mirror / sub).rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return mirror


def test_manifest_and_roundtrip(baseline):
    man = load_manifest(baseline)
    assert set(man["benchmarks"]) == set(SMALL)
    g = man["benchmarks"]["gsm8k"]
    assert g["rows"] == g["expected_rows"] == {"test": 1319, "train": 7473}
    assert g["source"] == "mirror" and set(g["input_sha256"]) == {
        "gsm8k/test.jsonl",
        "gsm8k/train.jsonl",
    }
    assert (
        g["output_sha256"]["gsm8k/test.parquet"]
        == __import__("hashlib").sha256((baseline / "gsm8k/test.parquet").read_bytes()).hexdigest()
    )
    assert (
        man["totals"]["rows"] == man["totals"]["expected_rows"] == 1319 + 7473 + 1000 + 508 + 500 + 164 + 600
    )
    rows = load_split(baseline, "aqua", "test")
    assert len(rows) == 254 and rows[0].meta["options"][0].startswith("A)") and len(rows[0].choices) == 5
    assert load_split(baseline, "gsm8k", "test")[0].choices is None
    with pytest.raises(DataError, match="unknown split 'val'"):
        load_split(baseline, "gsm8k", "val")
    with pytest.raises(DataError, match="run `agent-gspo prepare --benchmarks mmlu`"):
        load_split(baseline, "mmlu", "test")


def test_reprepare_is_deterministic_and_manifest_merges(out_dir):
    before = snapshot(out_dir)
    res = prepare_benchmark("svamp", mirror=MIRROR, out_dir=out_dir)
    assert res.splits == {"test": 1000} and res.seconds > 0
    prepare(["svamp"], mirror=MIRROR, out_dir=out_dir, progress=False)  # manifest keeps the other five
    assert snapshot(out_dir) == before


def _expect_untouched(out_dir: Path, before: dict) -> None:
    assert snapshot(out_dir) == before, "a failed prepare changed previously prepared outputs"


def test_malformed_json_line(out_dir, tmp_path):
    mirror, before = corrupt_mirror(tmp_path, "gsm8k"), snapshot(out_dir)
    f = mirror / "gsm8k/train.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    lines[99] = '{"question": "x", "answer": \n'
    f.write_text("".join(lines))
    with pytest.raises(DataError, match=r"gsm8k: .*gsm8k/train\.jsonl:100: invalid JSON"):
        prepare_benchmark("gsm8k", mirror=mirror, out_dir=out_dir)
    _expect_untouched(out_dir, before)


def test_missing_field(out_dir, tmp_path):
    mirror, before = corrupt_mirror(tmp_path, "svamp"), snapshot(out_dir)
    f = mirror / "svamp/SVAMP.json"
    data = json.loads(f.read_text())
    del data[7]["Answer"]
    f.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"svamp: .*svamp/SVAMP\.json: item 7: missing field 'Answer'"):
        prepare(["svamp"], mirror=mirror, out_dir=out_dir, progress=False)
    _expect_untouched(out_dir, before)


def test_duplicated_line_wrong_count(out_dir, tmp_path):
    mirror, before = corrupt_mirror(tmp_path, "gsm8k"), snapshot(out_dir)
    f = mirror / "gsm8k/test.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:10] + [lines[9]] + lines[10:]))
    with pytest.raises(DataValidationError, match=r"expect_table_row_count_to_equal") as err:
        prepare_benchmark("gsm8k", mirror=mirror, out_dir=out_dir)
    assert "gsm8k / test" in err.value.report and "| gsm8k | test | 1320 | 1319 |" in err.value.report
    _expect_untouched(out_dir, before)


def test_duplicate_id(out_dir, tmp_path):
    mirror, before = corrupt_mirror(tmp_path, "svamp"), snapshot(out_dir)
    f = mirror / "svamp/SVAMP.json"
    data = json.loads(f.read_text())
    data[5]["ID"] = data[4]["ID"]
    f.write_text(json.dumps(data))
    with pytest.raises(DataValidationError) as err:
        prepare_benchmark("svamp", mirror=mirror, out_dir=out_dir)
    assert "`expect_column_values_to_be_unique` on `id`" in err.value.report
    assert f"example rows: svamp/test/{data[4]['ID']}" in err.value.report
    _expect_untouched(out_dir, before)


def test_wrong_answer_letter(out_dir, tmp_path):
    mirror, before = corrupt_mirror(tmp_path, "aqua"), snapshot(out_dir)
    f = mirror / "aqua/test.json"
    lines = f.read_text().splitlines()
    row = json.loads(lines[3])
    row["correct"] = "F"
    lines[3] = json.dumps(row, ensure_ascii=False)
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataValidationError) as err:
        prepare_benchmark("aqua", mirror=mirror, out_dir=out_dir)
    rep = err.value.report
    assert "## aqua / test" in rep and "`expect_column_values_to_match_regex` on `answer`" in rep
    assert "example rows: aqua/test/3" in rep and "'F'" in rep and "aqua / dev" not in rep
    _expect_untouched(out_dir, before)


def test_truncated_gzip(out_dir, tmp_path):
    mirror, before = corrupt_mirror(tmp_path, "humaneval"), snapshot(out_dir)
    gz = mirror / "humaneval/HumanEval.jsonl.gz"
    gz.write_bytes(gz.read_bytes()[:-500])
    with pytest.raises(
        DataError, match=r"humaneval: .*HumanEval\.jsonl\.gz: corrupt or truncated gzip after line"
    ):
        prepare_benchmark("humaneval", mirror=mirror, out_dir=out_dir)
    _expect_untouched(out_dir, before)


def test_dropped_line_wrong_count(out_dir, tmp_path):
    mirror, before = corrupt_mirror(tmp_path, "math500"), snapshot(out_dir)
    f = mirror / "math500/test.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:-1]))
    with pytest.raises(
        DataValidationError, match=r"(?s)math500.*expect_table_row_count_to_equal.*observed 499"
    ):
        prepare_benchmark("math500", mirror=mirror, out_dir=out_dir)
    _expect_untouched(out_dir, before)


def test_validate_prepared_dir_and_tampered_parquet(out_dir, tmp_path):
    rep = validate(out_dir, tmp_path / "ok.md", ["aqua", "multiarith"])
    assert (
        rep.success and "**PASSED**: 3/3" in rep.markdown and (tmp_path / "ok.md").read_text() == rep.markdown
    )
    rows = [it.to_record() for it in load_split(out_dir, "multiarith", "test")]
    rows[10]["answer"] = "12 apples"
    rows[11]["choices"] = ["a", "b"]
    pq.write_table(records_to_table(rows), out_dir / "multiarith/test.parquet")
    record_in_manifest(out_dir, "multiarith", "test")  # as if prepare had written it: the suites judge it
    report_path = tmp_path / "bad.md"
    with pytest.raises(DataValidationError) as err:
        validate(out_dir, report_path, ["aqua", "multiarith", "mmlu"])
    text = report_path.read_text()
    assert text == err.value.report and "**FAILED**" in text
    assert (
        "example rows: multiarith/test/10" in text
        and "`expect_column_values_to_be_between` on `n_choices`" in text
    )
    assert "## mmlu / test" in text and "file_exists" in text and "## aqua" not in text


def test_validate_frame_unknown_split():
    table = records_to_table([])
    res = validate_frame("gsm8k", "val", table.to_pandas())
    assert not res.success and res.failures[0]["expectation"] == "split_in_allowed_set"


@pytest.mark.slow
def test_full_prepare_and_validate_all_benchmarks(tmp_path):
    t0 = time.perf_counter()
    rep = prepare(list(BENCHMARK_NAMES), mirror=MIRROR, out_dir=tmp_path / "data", progress=False)
    t1 = time.perf_counter()
    val = validate(tmp_path / "data", tmp_path / "report.md", list(BENCHMARK_NAMES))
    t2 = time.perf_counter()
    print(f"\nprepare {len(BENCHMARK_NAMES)} benchmarks: {t1 - t0:.2f} s, validate: {t2 - t1:.2f} s")
    # the seven + generated splitinfo (v1) and splitinfo2 (v2)
    assert val.success and rep.manifest["totals"]["rows"] == 27422 + 2300 + 2400
    assert {r.name: r.splits for r in rep.results}["mmlu"] == {"test": 14042, "val": 1531, "dev": 285}
    generated = {"splitinfo": "generated:splitinfo-v1", "splitinfo2": "generated:splitinfo-v2"}
    assert all(r.source == generated.get(r.name, f"mirror:{MIRROR}") for r in rep.results)


def test_the_same_inputs_typed_two_ways_give_one_manifest(tmp_path, monkeypatch):
    """The mirror's path is where the files are, not what they are: `../shared/benchmarks` and its
    absolute path must give the same manifest (the data version runs and the promotion gate compare)."""
    from components.data.prepare import manifest_sha256

    monkeypatch.chdir(MIRROR.parent)
    relative, absolute = tmp_path / "relative", tmp_path / "absolute"
    prepare(["aqua"], mirror=Path(MIRROR.name), out_dir=relative, progress=False, data=DataConfig(use_hub=False))
    prepare(["aqua"], mirror=MIRROR.resolve(), out_dir=absolute, progress=False, data=DataConfig(use_hub=False))
    assert manifest_sha256(relative) == manifest_sha256(absolute) is not None
    assert load_manifest(relative)["benchmarks"]["aqua"]["source"] == "mirror"
