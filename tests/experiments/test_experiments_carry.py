"""`experiments run --only baselines --resume`: the systems a baselines file holds are kept when they
were evaluated under the same config (but for eval.baselines), data and machine; only the missing
ones are evaluated; the merged file says where each kept system came from."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.experiments_fixtures import SETTINGS, cell, columns, make_results
from helpers.paths import REPO_ROOT
from pydantic import ValidationError

from components.config import Config, load_config
from experiments import runner as runner_mod
from experiments.carry import merge_carried, plan_carry, with_systems
from experiments.definitions import ExperimentError, experiment_config, select, settings_of
from experiments.results import ResultsFile, load_results, write_results
from experiments.runner import RunRequest

ROOT = REPO_ROOT
MACHINE = {"cpu": "AMD EPYC", "cores": 2, "torch": "2.13.0+cpu", "torch_threads": 2}
MANIFEST = "d" * 64
ALL = ["single_cot", "self_consistency", "mas_untrained", "mas_prior"]


def _cfg(*overrides: str) -> Config:
    base = load_config(ROOT / "params.yaml", "results", [f"model.name={SETTINGS['model.name']}",
                                                         "eval.benchmarks=[gsm8k, svamp]", *overrides])
    return experiment_config(base, select(base, ["baselines"])[0])


def _file(cfg: Config, systems: list[str], *, order: list[str] | None = None, commit: str = "a" * 40,
          run_id: str = "r-old", seconds: float = 3600.0, **extra) -> ResultsFile:
    """A baselines file as `experiments run` would write it for ``cfg`` evaluating ``systems``
    (``order``: the order eval.baselines listed them in, which the JSON file does not keep)."""
    items = {s: {"gsm8k": columns([i % (k + 2) == 0 for i in range(10)]),
                 "svamp": columns([i % (k + 3) == 0 for i in range(10)], [20] * 10)} for k, s in enumerate(systems)}
    raw = {"kind": "baselines", "items": items, "config_hash": with_systems(cfg, order or systems).hash(),
           "git_commit": commit, "machine": dict(MACHINE), "settings": settings_of(cfg), "eval_seconds": seconds,
           "mlflow": {"train_run_id": None, "eval_run_id": run_id, "model_version": None},
           "silence": {s: {"silent": [[0, 1], [0, 0], [1, 0]], "sent": [[10, 10]] * 3} for s in systems
                       if s.startswith("mas")}, **extra}
    return make_results("baselines", {}, **raw)


def test_plan_keeps_a_file_of_the_same_config_in_any_order_and_names_what_is_missing():
    cfg = _cfg()
    old = _file(cfg, ["mas_untrained", "single_cot"], order=["single_cot", "mas_untrained"])
    assert plan_carry(cfg, old, "b.json", manifest_sha256=MANIFEST, machine=MACHINE) == ["self_consistency",
                                                                                          "mas_prior"]


@pytest.mark.parametrize(("change", "message"), [
    ({"cfg": ["mas.rounds=3"]}, "mas.rounds: 2 vs 3"),
    ({"cfg": ["eval.self_consistency_k=7"]}, "a setting the results file does not list differs"),
    ({"manifest": "e" * 64}, "another version of the prepared data"),
    ({"machine": {**MACHINE, "cpu": "Intel Xeon"}}, "measured on AMD EPYC, 2 cores, torch 2.13.0+cpu x 2 threads"),
])
def test_plan_refuses_what_would_not_come_out_the_same(change, message):
    old = _file(_cfg(), ["mas_untrained"])
    with pytest.raises(ExperimentError, match="without --resume") as err:
        plan_carry(_cfg(*change.get("cfg", [])), old, "results/baselines.json",
                   manifest_sha256=change.get("manifest", MANIFEST), machine=change.get("machine", MACHINE))
    assert "results/baselines.json" in str(err.value) and message in str(err.value)


def test_plan_refuses_a_trained_experiments_file():
    trained = make_results("gspo_b25", {"agent_gspo": {"gsm8k": cell(0.3, 1000)}})
    with pytest.raises(ExperimentError, match="a gspo results file, not baselines"):
        plan_carry(_cfg(), trained, "x.json", manifest_sha256=MANIFEST, machine=MACHINE)


def test_merge_joins_in_config_order_and_records_where_the_kept_systems_came_from():
    cfg = _cfg()
    old = _file(cfg, ["mas_untrained", "mas_prior", "retired"], order=["mas_untrained", "mas_prior", "retired"])
    fresh = _file(with_systems(cfg, ["single_cot", "self_consistency"]), ["single_cot", "self_consistency"],
                  commit="b" * 40, run_id="r-new", seconds=900.0)
    merged = merge_carried(cfg, fresh, old)
    assert list(merged.eval) == list(merged.items) == list(merged.summary) == ALL  # "retired" is dropped
    assert list(merged.silence) == ["mas_untrained", "mas_prior"]
    assert merged.items["mas_untrained"] == old.items["mas_untrained"]
    assert merged.eval["single_cot"] == fresh.eval["single_cot"]
    assert (merged.config_hash, merged.git_commit, merged.mlflow["eval_run_id"], merged.eval_seconds) == (
        cfg.hash(), "b" * 40, "r-new", 900.0)
    [carried] = merged.carried
    assert (carried.systems, carried.git_commit, carried.config_hash, carried.eval_run_id, carried.eval_seconds) == (
        ["mas_untrained", "mas_prior"], "a" * 40, old.config_hash, "r-old", 3600.0)
    # resumed twice, one system each time: the provenance of each kept system survives, nothing counted twice
    two = _cfg("eval.baselines=[single_cot, mas_untrained]")
    first = merge_carried(two, _file(with_systems(cfg, ["single_cot"]), ["single_cot"], commit="b" * 40),
                          _file(cfg, ["mas_untrained"]))
    again = merge_carried(cfg, _file(with_systems(cfg, ["self_consistency", "mas_prior"]),
                                     ["self_consistency", "mas_prior"], commit="c" * 40), first)
    assert list(again.eval) == ALL and again.git_commit == "c" * 40
    assert [(c.systems, c.git_commit) for c in again.carried] == [(["mas_untrained"], "a" * 40),
                                                                 (["single_cot"], "b" * 40)]

@pytest.mark.parametrize(("field", "value"), [("item_ids_sha256", "b" * 64), ("limit", 50),
                                              ("machine", {**MACHINE, "torch_threads": 1})])
def test_merge_refuses_parts_that_did_not_see_the_same_items_or_machine(field, value):
    cfg = _cfg()
    old = _file(cfg, ["mas_untrained"])
    fresh = _file(with_systems(cfg, ["single_cot"]), ["single_cot"]).model_copy(update={field: value})
    with pytest.raises(ExperimentError, match=f"differ in {field}.*nothing was written"):
        merge_carried(_cfg("eval.baselines=[single_cot, mas_untrained]"), fresh, old)


def test_a_results_file_refuses_carried_systems_it_does_not_hold_or_that_leave_it_nothing_new():
    cfg = _cfg()
    merged = merge_carried(_cfg("eval.baselines=[single_cot, mas_untrained]"),
                           _file(with_systems(cfg, ["single_cot"]), ["single_cot"]), _file(cfg, ["mas_untrained"]))
    raw = merged.model_dump(mode="json")
    for systems, why in ((["mas_prior"], "must be distinct, evaluated in this file"),
                         (["mas_untrained", "single_cot"], "leave at least one system")):
        bad = raw | {"carried": [raw["carried"][0] | {"systems": systems}]}
        with pytest.raises(ValidationError, match=why):
            ResultsFile.model_validate(bad)
    with pytest.raises(ValidationError, match="only a baselines file carries"):
        ResultsFile.model_validate(raw | {"kind": "gspo", "history": [{"step": 1.0}], "trained_model": "x"})


class FakeEval:
    """Stands in for run_one: evaluates (synthetically) exactly the systems its config lists."""

    def __init__(self) -> None:
        self.systems: list[list[str]] = []

    def __call__(self, cfg, exp, overrides, ctx, resume=False):
        self.systems.append(list(cfg.eval.baselines))
        return _file(cfg, list(cfg.eval.baselines), commit="b" * 40, run_id="r-new", overrides=list(overrides))


def _runner_env(tmp_path: Path, monkeypatch) -> tuple[Path, FakeEval]:
    monkeypatch.setattr(runner_mod, "manifest_sha256", lambda data_dir: MANIFEST)
    monkeypatch.setattr(runner_mod, "machine_fingerprint", lambda: dict(MACHINE))
    fake = FakeEval()
    monkeypatch.setattr(runner_mod, "run_one", fake)
    return tmp_path / "res", fake


def test_resume_evaluates_only_the_missing_systems_and_writes_the_merged_file(tmp_path, monkeypatch):
    results, fake = _runner_env(tmp_path, monkeypatch)
    cfg = _cfg()
    base = load_config(ROOT / "params.yaml", "results", [f"model.name={SETTINGS['model.name']}",
                                                         "eval.benchmarks=[gsm8k, svamp]"])
    write_results(results / "baselines.json", _file(cfg, ["mas_untrained"]))
    logs: list[str] = []
    runner_mod.run_experiments(base, RunRequest(only=["baselines"], results_dir=results, track=False, log=logs.append,
                               resume=True))
    assert fake.systems == [["single_cot", "self_consistency", "mas_prior"]]
    merged = load_results(results / "baselines.json")
    assert sorted(merged.eval) == sorted(ALL) and merged.carried[0].systems == ["mas_untrained"]  # JSON: sorted keys
    assert merged.config_hash == cfg.hash()
    assert any("keeping mas_untrained" in line and "evaluating single_cot, self_consistency, mas_prior" in line
               for line in logs)

    before = (results / "baselines.json").read_bytes()
    runner_mod.run_experiments(base, RunRequest(only=["baselines"], results_dir=results, track=False, log=logs.append,
                               resume=True))
    assert len(fake.systems) == 1 and (results / "baselines.json").read_bytes() == before
    assert "nothing to evaluate (--resume)" in logs[-1]

    runner_mod.run_experiments(base, RunRequest(only=["baselines"], results_dir=results, track=False, log=logs.append))
    assert fake.systems[-1] == ALL and load_results(results / "baselines.json").carried is None  # no --resume


def test_resume_refuses_an_unkeepable_file_before_anything_runs(tmp_path, monkeypatch):
    results, fake = _runner_env(tmp_path, monkeypatch)
    write_results(results / "baselines.json", _file(_cfg("mas.rounds=3"), ["mas_untrained"]))
    before = (results / "baselines.json").read_bytes()
    base = load_config(ROOT / "params.yaml", "results", [f"model.name={SETTINGS['model.name']}",
                                                         "eval.benchmarks=[gsm8k, svamp]"])
    with pytest.raises(ExperimentError, match="mas.rounds: 3 vs 2"):
        runner_mod.run_experiments(base, RunRequest(only=["lambda0", "baselines"], results_dir=results, track=False,
                                   log=lambda s: None, resume=True))
    assert fake.systems == [] and (results / "baselines.json").read_bytes() == before


def test_the_report_names_the_kept_systems_and_where_they_came_from(tmp_path):
    from experiments.report import build_report

    cfg = _cfg()
    merged = merge_carried(_cfg("eval.baselines=[single_cot, mas_untrained]"),
                           _file(with_systems(cfg, ["single_cot"]), ["single_cot"], commit="b" * 40),
                           _file(cfg, ["mas_untrained"], run_id="r-old", seconds=3797.2))
    write_results(tmp_path / "res" / "baselines.json", merged)
    build_report(tmp_path / "res", tmp_path / "results.md")
    md = (tmp_path / "results.md").read_text()
    assert (f"baselines: mas_untrained kept (`--resume`) from an earlier evaluation under the same config but for "
            f"`eval.baselines` (git `aaaaaaaaaa`, config `{merged.carried[0].config_hash[:12]}`, eval run r-old, "
            "3797 s)") in md
