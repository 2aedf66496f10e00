"""Hostile-input robustness of ``prepare`` / ``validate`` on small synthetic mirrors (no network):
all-or-nothing multi-benchmark prepares, the failure report, one clear message (exit 2) instead of
a traceback, symlinked leftovers, and HumanEval records that cannot be evaluated."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.cli import main
from components.config import DataConfig
from components.data.adapters import load_mirror
from components.data.expectations import validate, validate_frame
from components.data.prepare import prepare, records_to_table
from components.data.sources import load_benchmark
from components.data.spec import DataError, DataSourceError, DataValidationError
from components.errors import UserError
from components.io import atomic_dir, recover_leftovers

OFFLINE = DataConfig(use_hub=False)
"""the mirror only: prepare never asks the hub"""

MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", REPO_ROOT.parent / "shared"
                             / "benchmarks"))


def multiarith_items(n: int = 600) -> list[dict]:
    return [{"iIndex": i, "sQuestion": f"Tom has {i} apples. How many?", "lEquations": [f"X={i}"],
             "lSolutions": [float(i)], "lAlignments": []} for i in range(n)]


def humaneval_rows(n: int = 164, variant: str = "") -> list[dict]:
    return [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x{variant}.\"\"\"\n",
             "canonical_solution": "    return x\n", "entry_point": f"f{i}",
             "test": "def check(candidate):\n    assert candidate(1) == 1\n"} for i in range(n)]


def write_mirror(root: Path, multiarith: list | None = None, humaneval: list[dict] | None = None) -> Path:
    if multiarith is not None:
        (root / "multiarith").mkdir(parents=True, exist_ok=True)
        (root / "multiarith/MultiArith.json").write_text(json.dumps(multiarith))
    if humaneval is not None:
        (root / "humaneval").mkdir(parents=True, exist_ok=True)
        with gzip.open(root / "humaneval/HumanEval.jsonl.gz", "wt") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in humaneval)
    return root


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if not p.name.endswith(".lock")}


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    """A valid prepared folder (multiarith + humaneval) from a synthetic mirror."""
    good = write_mirror(tmp_path / "good", multiarith_items(), humaneval_rows())
    prepare(["multiarith", "humaneval"], mirror=good, out_dir=tmp_path / "out", data=OFFLINE, progress=False)
    return tmp_path / "out"


def run_cli(*args: str, mirror: Path, out: Path, report_dir: Path, benchmarks: str = "multiarith") -> int:
    return main(["prepare", "--mirror", str(mirror), "--benchmarks", benchmarks, "--out", str(out),
                 "--no-validate", "--set", "data.use_hub=false", "--set", f"data.report_dir={report_dir}", *args])


def test_failed_multi_benchmark_prepare_leaves_every_output_untouched(prepared: Path, tmp_path: Path) -> None:
    before = snapshot(prepared)
    # humaneval changed but valid, multiarith one row short: neither may be written
    bad = write_mirror(tmp_path / "bad", multiarith_items(599), humaneval_rows(variant=" (changed)"))
    with pytest.raises(DataValidationError, match=r"multiarith: .*nothing was written") as err:
        prepare(["humaneval", "multiarith"], mirror=bad, out_dir=prepared, data=OFFLINE, progress=False)
    assert snapshot(prepared) == before  # humaneval/test.parquet and the manifest too
    assert "| humaneval | test | 164 | 164 | ok |" in err.value.report  # all requested were checked


def test_a_failing_suite_in_prepare_writes_the_report(prepared: Path, tmp_path: Path, capsys) -> None:
    bad = write_mirror(tmp_path / "bad", multiarith_items(599))
    reports = tmp_path / "reports"
    assert run_cli(mirror=bad, out=prepared, report_dir=reports) == 2
    text = (reports / "validation.md").read_text()
    assert "## multiarith / test" in text and "expect_table_row_count_to_equal" in text
    assert f"report: {reports / 'validation.md'}" in capsys.readouterr().err

    items = multiarith_items()
    write_mirror(bad, items[:579] + [items[3]] * 21)  # 21 repeats; the upstream data has 20
    with pytest.raises(DataValidationError):
        prepare(["multiarith"], mirror=bad, out_dir=prepared, data=OFFLINE, progress=False,
                report_path=reports / "validation.md")
    assert "example rows: multiarith/test/" in (reports / "validation.md").read_text()


def test_null_multiarith_item_is_a_data_error(tmp_path: Path) -> None:
    items: list = multiarith_items()
    items[5] = None
    mirror = write_mirror(tmp_path / "m", items)
    with pytest.raises(DataError, match=r"multiarith: .*MultiArith\.json: item 5: expected a JSON object"):
        load_mirror("multiarith", mirror)


@pytest.mark.parametrize(("val", "expected"), [
    (b'"Ok?",a,b,c,d,A\n"Caf\xe9?",a,b,c,d,B\n', r"mmlu: .*anatomy_val\.csv:2: not UTF-8"),  # latin-1
    (b'\xef\xbb\xbf"Ok?",a,b,c,d,A\n', r"mmlu: .*anatomy_val\.csv:1: starts with a UTF-8 BOM"),  # was: row width
])
def test_an_mmlu_csv_that_is_not_plain_utf8_is_a_data_error(tmp_path: Path, val: bytes, expected: str) -> None:
    for split in ("test", "val", "dev"):
        (tmp_path / f"mmlu/data/{split}").mkdir(parents=True)
        (tmp_path / f"mmlu/data/{split}/anatomy_{split}.csv").write_bytes(b'"What?",a,b,c,d,A\n')
    (tmp_path / "mmlu/data/val/anatomy_val.csv").write_bytes(val)
    with pytest.raises(DataError, match=expected):
        load_mirror("mmlu", tmp_path)


def test_unusable_out_folder_exits_2(tmp_path: Path, capsys) -> None:
    good = write_mirror(tmp_path / "good2", multiarith_items())
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert run_cli(mirror=good, out=afile, report_dir=tmp_path / "r") == 2
    assert "afile: exists and is not a folder" in capsys.readouterr().err and afile.read_text() == "x"
    if Path("/proc/self").is_dir():
        assert run_cli(mirror=good, out=Path("/proc/agent_gspo_out"), report_dir=tmp_path / "r") == 2
        assert "/proc/agent_gspo_out: cannot write there" in capsys.readouterr().err


def test_report_folder_that_is_a_file_fails_before_writing(prepared: Path, tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    before = snapshot(prepared)
    changed = write_mirror(tmp_path / "changed", [{**r, "sQuestion": r["sQuestion"] + "!"} for r in multiarith_items()])
    assert run_cli(mirror=changed, out=prepared, report_dir=afile) == 2  # checked before anything is written
    assert "report folder (data.report_dir)" in capsys.readouterr().err and snapshot(prepared) == before
    with pytest.raises(UserError, match="exists and is not a folder"):
        validate(prepared, afile / "validation.md", ["multiarith"])


def test_symlinked_benchmark_folder_leaves_no_backup_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench").symlink_to(victim)
    with atomic_dir(out / "bench") as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["bench"] and not (out / "bench").is_symlink()
    assert (victim / "keep.txt").read_text() == "mine"
    # a backup link left by an older version (or a cut swap) is unlinked, never followed
    (out / ".bench.old-abc123").symlink_to(victim)
    assert recover_leftovers(out / "bench") == ["removed .bench.old-abc123"]
    assert sorted(p.name for p in out.iterdir()) == ["bench"] and (victim / "keep.txt").read_text() == "mine"


def test_mirror_that_is_a_file_is_not_called_missing(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(DataSourceError, match=rf"mirror:{afile}: is not a folder"):
        load_benchmark("multiarith", mirror=afile, use_hub=False)
    with pytest.raises(DataSourceError, match="folder does not exist"):
        load_benchmark("multiarith", mirror=tmp_path / "nope", use_hub=False)


def test_humaneval_entry_point_and_assertion_checks(tmp_path: Path) -> None:
    rows = humaneval_rows()
    rows[3]["entry_point"] = "nonexistent_fn"
    rows[7]["test"] = "def check(candidate):\n    pass  # assert nothing\n"
    frame = records_to_table(load_mirror("humaneval", write_mirror(tmp_path, humaneval=rows))["test"]).to_pandas()
    res = validate_frame("humaneval", "test", frame)
    assert not res.success
    found = {f["column"]: f["example_rows"] for f in res.failures}
    assert found == {"entry_point_defined_in_prompt": ["humaneval/HumanEval/3"],
                     "test_check_has_assert": ["humaneval/HumanEval/7"]}


@pytest.mark.skipif(not (MIRROR / "humaneval").is_dir(), reason=f"no mirror at {MIRROR}")
def test_real_humaneval_passes_the_code_checks() -> None:
    frame = records_to_table(load_mirror("humaneval", MIRROR)["test"]).to_pandas()
    assert len(frame) == 164 and validate_frame("humaneval", "test", frame).success
