"""Gold answers straight from the offline mirror must score (near) 100 %: a check of the checkers."""
import csv
import gzip
import json
import os
from pathlib import Path

import pytest
from helpers import grade_rows
from helpers.paths import REPO_ROOT

pytestmark = pytest.mark.slow


def _mirror() -> Path:
    env = os.environ.get("AGENT_GSPO_DATA_MIRROR")
    path = Path(env) if env else REPO_ROOT / "../shared/benchmarks"
    if not (path / "README.md").exists():
        pytest.skip(f"benchmark mirror not found at {path} (set AGENT_GSPO_DATA_MIRROR)")
    return path


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _report(name: str, results: list, rows: list, key) -> int:
    correct = sum(r.correct for r in results)
    print(f"\n{name}: {correct}/{len(rows)} correct, {sum(r.error is not None for r in results)} grader errors")
    for res, row in zip(results, rows, strict=True):
        if not res.correct:
            print(f"  miss {key(row)}: extracted={res.extracted!r} error={res.error!r}")
    return correct


def test_gsm8k_worked_answers() -> None:
    rows = _jsonl(_mirror() / "gsm8k/test.jsonl")
    items = [("numeric", r["answer"], r["answer"].split("####")[-1].strip(), {}) for r in rows]
    results = grade_rows(items)
    assert _report("gsm8k test", results, rows, lambda r: r["question"][:60]) == len(rows) == 1319


def test_aqua_and_mmlu_letters() -> None:
    mirror = _mirror()
    rows = _jsonl(mirror / "aqua/test.json")
    items = [("choice", f"The answer is ({r['correct']})", r["correct"], {"choices": r["options"]}) for r in rows]
    assert _report("aqua test", grade_rows(items), rows, lambda r: r["question"][:60]) == len(rows) == 254
    mmlu = []
    for path in sorted((mirror / "mmlu/data/test").glob("*_test.csv")):
        with open(path, newline="", encoding="utf-8") as fh:
            mmlu.extend(csv.reader(fh))
    items = [("choice", f"The answer is ({r[5]})", r[5], {"choices": r[1:5]}) for r in mmlu]
    assert _report("mmlu test", grade_rows(items), mmlu, lambda r: r[0][:60]) == len(mmlu) == 14042


def test_math500_solutions_self_verify() -> None:
    rows = _jsonl(_mirror() / "math500/test.jsonl")
    results = grade_rows([("math", r["solution"], r["answer"], {}) for r in rows])
    assert _report("math500", results, rows, lambda r: r["unique_id"]) >= 498


def test_humaneval_canonical_solutions() -> None:
    rows = _jsonl(_mirror() / "humaneval/HumanEval.jsonl.gz")
    items = [("code", r["canonical_solution"], "",
              {"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]}) for r in rows]
    assert _report("humaneval", grade_rows(items), rows, lambda r: r["task_id"]) == len(rows) == 164
