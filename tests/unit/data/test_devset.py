"""The dev set (issue 52): disjoint from the test sample, deterministic, recorded by id hash, and refused
with a clear error where it cannot exist (components/data/devset.py, docs/data.md "Dev set")."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from components.cli import main
from components.config import Config
from components.data.devset import (
    DEV_SOURCES,
    DEVSET,
    dev_items,
    dev_seed,
    devset_sha256,
    load_dev_items,
)
from components.data.item import Item
from components.data.prepare import load_split
from components.data.sampling import ids_sha256, sample_items
from components.data.spec import DataError
from components.evaluation.setting import item_ids_sha256, planned_setting, sample_split

SEVEN = ("aqua", "mmlu", "gsm8k", "multiarith", "svamp", "math500", "humaneval")
STUDY_LIMIT, STUDY_SEED = 100, 1234
"""the study's eval.limit (results profile) and eval.seed (params.yaml)"""

REAL_DEVSET_SHA256 = "591758968993e28069eed9d4656cf691d63f5be8c9c278cbdcf056625dd5f58c"
"""the seven dev samples at eval.limit 100, eval.seed 1234 of the prepared mirror (docs/data.md)"""


def _items(benchmark: str, n: int, split: str = "test") -> list[Item]:
    return [Item(id=f"{benchmark}/{split}/{k}", benchmark=benchmark, question=f"q{k}", answer=str(k),
                 answer_type="numeric", split=split) for k in range(n)]


def test_the_table_covers_the_seven_benchmarks_with_an_official_split_where_one_exists() -> None:
    assert set(DEV_SOURCES) == set(SEVEN)
    assert {b: s.split for b, s in DEV_SOURCES.items() if s.split} == {"aqua": "dev", "mmlu": "val", "gsm8k": "train"}
    assert DEV_SOURCES["humaneval"].n == 64 and all(s.n == 100 for b, s in DEV_SOURCES.items() if b != "humaneval")


def test_a_test_only_benchmark_gets_test_items_outside_the_test_sample() -> None:
    test = _items("multiarith", 600)
    dev = dev_items("multiarith", test, test_limit=100, eval_seed=STUDY_SEED)
    held = {i.id for i in sample_items(test, 100, STUDY_SEED)}
    ids = [i.id for i in dev.items]
    assert len(ids) == len(set(ids)) == 100 and not held & set(ids)
    assert (dev.source, dev.split, dev.pool, dev.seed) == ("multiarith/test-minus-sample", "test", 500,
                                                          dev_seed(STUDY_SEED))


def test_same_seed_same_ids_whatever_the_row_order_and_the_hash_is_pinned() -> None:
    test = _items("math500", 500)
    shuffled = list(test)
    random.Random(7).shuffle(shuffled)
    a = dev_items("math500", test, test_limit=100, eval_seed=1234)
    b = dev_items("math500", shuffled, test_limit=100, eval_seed=1234)
    assert [i.id for i in a.items] == [i.id for i in b.items]
    assert a.ids_sha256 == "d4bb6170e87a8036467714bb1e5191ffdb3a0387822b4b186a0a4f31eadc7db0"
    assert a.ids_sha256 == ids_sha256({"math500": [i.id for i in a.items]}) == item_ids_sha256(
        {"math500": [i.id for i in a.items]})  # the evaluation's item_ids_sha256 convention
    other = dev_items("math500", test, test_limit=100, eval_seed=99)
    assert [i.id for i in other.items] != [i.id for i in a.items]


def test_the_dev_ranking_is_its_own_stream_not_the_test_ranking() -> None:
    val = _items("mmlu", 300, "val")
    dev = dev_items("mmlu", val, test_limit=100, eval_seed=STUDY_SEED)
    assert dev_seed(STUDY_SEED) != STUDY_SEED
    assert [i.id for i in dev.items] != [i.id for i in sample_items(val, 100, STUDY_SEED)]
    assert (dev.source, dev.pool) == ("mmlu/val", 300)


def test_an_official_split_needs_no_test_limit() -> None:
    dev = dev_items("aqua", _items("aqua", 254, "dev"), test_limit=None, eval_seed=STUDY_SEED)
    assert (dev.source, dev.pool, len(dev.items)) == ("aqua/dev", 254, 100)


@pytest.mark.parametrize("bench, size, limit, n, message", [
    ("humaneval", 164, 120, None, "humaneval: dev pool too small: 164 test items less the 120-item test sample "
                                  "(eval.limit 120, eval.seed 1234) leaves 44, the dev set needs 64"),
    ("humaneval", 164, 100, 100, "humaneval: dev pool too small: 164 test items less the 100-item test sample "
                                 "(eval.limit 100, eval.seed 1234) leaves 64, the dev set needs 100"),
    ("aqua", 50, 100, None, "aqua: dev pool too small: 50 items of aqua/dev leaves 50, the dev set needs 100"),
    ("svamp", 1000, None, None, "svamp: no dev set with eval.limit null: the whole test split (1000 items) is the "
                                "test sample"),
    ("splitinfo", 10, 5, None, "splitinfo: no dev set defined"),
])
def test_no_dev_set_where_the_pool_cannot_hold_it(bench, size, limit, n, message) -> None:
    with pytest.raises(DataError, match="^" + re.escape(message)):
        dev_items(bench, _items(bench, size), test_limit=limit, eval_seed=STUDY_SEED, n=n)


def test_humaneval_at_the_study_limit_gets_the_whole_complement() -> None:
    test = _items("humaneval", 164)
    dev = dev_items("humaneval", test, test_limit=100, eval_seed=STUDY_SEED)
    held = {i.id for i in sample_items(test, 100, STUDY_SEED)}
    assert {i.id for i in dev.items} == {i.id for i in test} - held and dev.pool == 64


# --- the real benchmarks (prepared from the mirror once per session; skipped without it) ---

def _cfg(data: Path, **eval_: object) -> Config:
    return Config.model_validate({"data": {"out_dir": str(data)},
                                  "eval": {"limit": STUDY_LIMIT, "seed": STUDY_SEED, "benchmarks": list(SEVEN),
                                           **eval_}})


def test_every_benchmark_dev_set_is_disjoint_from_its_reported_test_sample(prepared_data: Path) -> None:
    samples = []
    for b in SEVEN:
        dev = load_dev_items(prepared_data, b, test_limit=STUDY_LIMIT, eval_seed=STUDY_SEED)
        test = {i.id for i in sample_items(load_split(prepared_data, b, "test"), STUDY_LIMIT, STUDY_SEED)}
        assert len(test) == STUDY_LIMIT and not test & {i.id for i in dev.items}, b
        assert len(dev.items) == DEV_SOURCES[b].n, b
        samples.append(dev)
    assert {s.benchmark: s.pool for s in samples} == {"aqua": 254, "mmlu": 1531, "gsm8k": 7473, "multiarith": 500,
                                                      "svamp": 900, "math500": 400, "humaneval": 64}
    assert devset_sha256(samples) == REAL_DEVSET_SHA256
    items, record = sample_split(_cfg(prepared_data), prepared_data, SEVEN, DEVSET, None)
    assert item_ids_sha256({b: [i.id for i in its] for b, its in items.items()}) == REAL_DEVSET_SHA256
    assert record is not None and record["gsm8k"]["in_train_sources"] and not record["aqua"]["in_train_sources"]
    assert planned_setting(_cfg(prepared_data), split=DEVSET).item_ids_sha256 == REAL_DEVSET_SHA256
    capped, _ = sample_split(_cfg(prepared_data), prepared_data, SEVEN, DEVSET, 3)  # --limit: the first 3
    assert all([i.id for i in capped[b]] == [i.id for i in items[b][:3]] for b in SEVEN)


@pytest.mark.e2e
def test_cli_evaluate_split_devset_records_each_benchmarks_source(prepared_data: Path, tmp_path: Path,
                                                                  one_thread) -> None:
    out = tmp_path / "eval"
    assert main(["evaluate", "--no-track", "--split", DEVSET, "--limit", "1", "--baselines", "", "--out", str(out),
                 "--model", "tiny-random", "--set", f"data.out_dir={prepared_data}",
                 "--set", "eval.benchmarks=[gsm8k,humaneval]", "--set", f"eval.limit={STUDY_LIMIT}",
                 "--set", f"eval.seed={STUDY_SEED}", "--set", "mas.agents=2", "--set", "mas.rounds=1",
                 "--set", "mas.max_message_tokens=4", "--set", "mas.context_tokens=128"]) == 0
    meta = json.loads((out / "summary.json").read_text())["meta"]
    assert meta["split"] == DEVSET and meta["limit"] == 1
    dev = meta["devset"]
    assert dev["test_limit"] == STUDY_LIMIT
    assert {b: (d["source"], d["split"], d["pool"], d["n"]) for b, d in dev["benchmarks"].items()} == {
        "gsm8k": ("gsm8k/train", "train", 7473, 1), "humaneval": ("humaneval/test-minus-sample", "test", 64, 1)}
    full = {b: load_dev_items(prepared_data, b, test_limit=STUDY_LIMIT, eval_seed=STUDY_SEED)
            for b in dev["benchmarks"]}
    assert meta["item_ids"] == {b: [s.items[0].id] for b, s in full.items()}
    assert "- **split**: `devset`" in (out / "report.md").read_text()


def test_cli_evaluate_split_devset_with_a_null_limit_is_one_line_exit_2(prepared_data: Path, tmp_path: Path,
                                                                       capsys) -> None:
    out = tmp_path / "eval"
    assert main(["evaluate", "--no-track", "--split", DEVSET, "--baselines", "", "--out", str(out),
                 "--model", "tiny-random", "--set", f"data.out_dir={prepared_data}",
                 "--set", "eval.benchmarks=[humaneval]", "--set", "eval.limit=null"]) == 2
    err = capsys.readouterr().err
    assert "humaneval: no dev set with eval.limit null" in err and "Traceback" not in err and not out.exists()
