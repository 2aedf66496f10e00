"""The study on the dev set (issue 52): ``experiments.eval_split=devset`` evaluates every experiment on
items disjoint from the reported test sample, the results file records the split and the dev id hash,
the report says so, and old files (no split recorded) still read as test."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.experiments_fixtures import baselines, cell, make_results
from helpers.paths import REPO_ROOT
from pydantic import ValidationError

from components.config import load_config
from components.data.devset import DEVSET, devset_sha256, load_dev_items
from components.data.prepare import load_split
from components.data.sampling import sample_items
from experiments import runner as runner_mod
from experiments.carry import plan_carry, with_systems
from experiments.definitions import ExperimentError, experiment_config, select
from experiments.report import build_report, devset_line
from experiments.results import DevsetInfo, ResultsFile, load_results, write_results
from experiments.runner import RunRequest

ROOT = REPO_ROOT
DEV = {"test_limit": 100, "benchmarks": {
    "gsm8k": {"source": "gsm8k/train", "split": "train", "pool": 7473, "n": 100, "seed": 5, "ids_sha256": "1" * 64,
              "in_train_sources": True},
    "svamp": {"source": "svamp/test-minus-sample", "split": "test", "pool": 900, "n": 100, "seed": 5,
              "ids_sha256": "2" * 64, "in_train_sources": False}}}


def test_old_results_files_read_as_test_and_a_devset_file_must_say_where_its_items_came_from() -> None:
    committed = load_results(ROOT / "results" / "baselines.json")  # written before the split was recorded
    assert committed.eval_split == "test" and committed.devset is None
    assert make_results("b", {"agent_gspo": {"gsm8k": cell(0.3, 10)}}, eval_split="devset", devset=DEV).devset
    with pytest.raises(ValidationError, match="devset: recorded for eval_split devset only"):
        make_results("b", {"agent_gspo": {"gsm8k": cell(0.3, 10)}}, eval_split="devset")
    with pytest.raises(ValidationError, match="devset: recorded for eval_split devset only"):
        make_results("b", {"agent_gspo": {"gsm8k": cell(0.3, 10)}}, devset=DEV)
    with pytest.raises(ValidationError, match="not the evaluated benchmarks"):
        make_results("b", {"agent_gspo": {"gsm8k": cell(0.3, 10)}}, eval_split="devset",
                     devset={**DEV, "benchmarks": {"gsm8k": DEV["benchmarks"]["gsm8k"]}})


def _report(folder: Path, *results: ResultsFile) -> str:
    for r in results:
        write_results(folder / f"{r.name}.json", r)
    return build_report(folder, folder.parent / f"{folder.name}.md").markdown


def test_the_report_says_a_results_set_was_evaluated_on_the_dev_set_and_warns_on_mixed_splits(tmp_path) -> None:
    dev = {"eval_split": "devset", "devset": DEV, "item_ids": "e" * 64}
    on_dev = make_results("baselines", baselines().model_dump()["eval"], kind="baselines", **dev)
    md = _report(tmp_path / "dev", on_dev)
    assert devset_line(DevsetInfo(**DEV), "e" * 64) in md
    assert "DEV SET, not the test sample" in md and "`eeeeeeeeeeee`" in md and "gsm8k 100 from gsm8k/train" in md
    assert "The dev items of gsm8k come from a split in data.train_sources" in md
    assert "same seeded sample" not in md
    b25 = make_results("gspo_b25", {"agent_gspo": {"gsm8k": cell(0.3, 10), "svamp": cell(0.3, 10)}}, **dev)
    mixed = _report(tmp_path / "mixed", baselines(), b25)
    assert "evaluated on different splits (test: baselines; devset: gspo_b25)" in mixed
    assert "DEV SET" not in _report(tmp_path / "test", baselines())  # a test results set reads as before


def _study(*overrides: str):
    return load_config(ROOT / "params.yaml", "results", ["model.name=tiny-random", *overrides])


def test_limit_is_refused_with_the_dev_set_and_resume_refuses_a_file_of_the_other_split(tmp_path) -> None:
    with pytest.raises(ExperimentError, match="--limit 5 with experiments.eval_split=devset"):
        runner_mod.run_experiments(_study("experiments.eval_split=devset"),
                                   RunRequest(only=["baselines"], limit=5, results_dir=tmp_path, track=False))
    base = _study("experiments.eval_split=devset", "eval.benchmarks=[gsm8k, svamp]")
    cfg = experiment_config(base, select(base, ["baselines"])[0])
    old = make_results("baselines", {"single_cot": {"gsm8k": cell(0.3, 10), "svamp": cell(0.3, 10)}},
                       kind="baselines", config_hash=with_systems(cfg, ["single_cot"]).hash(), machine={"cpu": "x"})
    with pytest.raises(ExperimentError, match="evaluated on test, this run evaluates devset"):
        plan_carry(cfg, old, "b.json", manifest_sha256="d" * 64, machine={"cpu": "x"})


@pytest.mark.e2e
def test_a_study_run_on_the_dev_set_records_the_split_and_the_dev_id_hash(prepared_data: Path, tmp_path: Path,
                                                                        one_thread) -> None:
    benches = ["gsm8k", "multiarith"]
    cfg = _study("experiments.eval_split=devset", f"eval.benchmarks=[{', '.join(benches)}]",
                 "eval.baselines=[single_cot]", "mas.max_message_tokens=4", "mas.context_tokens=128",
                 f"data.out_dir={prepared_data}", f"eval.out_dir={tmp_path / 'eval'}")
    [out] = runner_mod.run_experiments(cfg, RunRequest(only=["baselines"], results_dir=tmp_path / "results",
                                                       track=False, log=lambda s: None))
    res = load_results(out.path)
    assert isinstance(res, ResultsFile) and res.eval_split == DEVSET and res.limit is None
    dev = [load_dev_items(prepared_data, b, test_limit=100, eval_seed=cfg.eval.seed) for b in benches]
    assert res.item_ids_sha256 == devset_sha256(dev)
    assert res.devset is not None and res.devset.test_limit == 100
    assert {b: (d.source, d.n, d.ids_sha256) for b, d in res.devset.benchmarks.items()} == {
        s.benchmark: (s.source, len(s.items), s.ids_sha256) for s in dev}
    for s in dev:  # never an item of the test sample the study reports
        test = {i.id for i in sample_items(load_split(prepared_data, s.benchmark, "test"), 100, cfg.eval.seed)}
        assert not test & {i.id for i in s.items}
    assert res.eval["single_cot"]["gsm8k"].n == 100
    md = build_report(tmp_path / "results", tmp_path / "r.md").markdown
    assert f"dev ids sha256 `{res.item_ids_sha256[:12]}`" in md
