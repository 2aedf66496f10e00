"""Experiment definitions (params.yaml -> experiments), the budget B from a baselines file, and the
runner's wiring (which experiment runs first, which B each gets) with a fake in place of training."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.experiments_fixtures import SETTINGS, baselines, cell, make_results  # noqa: E402

from components.config import Config, ConfigError, load_config  # noqa: E402
from components.experiments import (  # noqa: E402
    ExperimentError,
    budget_from_baseline,
    experiment_config,
    load_results,
    resolve,
    select,
    write_results,
)
from components.experiments import runner as runner_mod  # noqa: E402
from components.experiments.definitions import check_compatible, settings_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "params.yaml"
NAMES = ["baselines", "gspo_b50", "gspo_b25", "lambda0", "no_adv_norm", "grpo_token", "silence_proof"]


def _params(tmp_path: Path, definitions: dict, **section) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"experiments": {"definitions": definitions, **section}}))
    return path


def test_committed_definitions_validate_and_resolve_under_every_profile():
    for profile in ("default", "smoke", "results"):
        base = load_config(PARAMS, profile)
        exps = resolve(base)
        assert list(exps) == NAMES
        for exp in exps.values():
            cfg = experiment_config(base, exp, budget_target=123.0 if exp.budget_fraction else None)
            assert cfg.gspo.out_dir == str(Path(base.experiments.runs_dir) / exp.name)
            assert cfg.eval == base.eval.model_copy(update={"out_dir": str(Path(cfg.gspo.out_dir) / "eval")})
    base = load_config(PARAMS, "results")
    exps = resolve(base)
    assert exps["baselines"].kind == "baselines" and exps["gspo_b50"].budget_fraction == 0.5
    assert exps["grpo_token"].budget_fraction == 0.25 and exps["no_adv_norm"].budget_fraction == 0.25
    grpo = experiment_config(base, exps["grpo_token"], budget_target=50.0)
    assert grpo.gspo.level == "token" and grpo.budget.target == 50.0 and grpo.budget.enabled
    assert experiment_config(base, exps["no_adv_norm"], budget_target=1.0).gspo.adv_norm == "none"
    lam = experiment_config(base, exps["lambda0"])
    assert (lam.reward.lambda_tok, lam.budget.enabled, lam.reward.lambda_turn, lam.reward.lambda_rep) == (
        0, False, 0, 0)
    # the results profile: SmolLM2, 3 agents x 2 rounds, 32-token messages, 100 items
    assert (base.model.name, base.mas.agents, base.mas.rounds, base.mas.max_message_tokens, base.eval.limit) == (
        "smollm2-135m-instruct", 3, 2, 32, 100)


def test_user_overrides_win_over_the_definition():
    base = load_config(PARAMS, "results")
    exp = resolve(base)["lambda0"]
    cfg = experiment_config(base, exp, user_overrides=["reward.lambda_tok=0.5", "model.name=tiny-random"])
    assert cfg.reward.lambda_tok == 0.5 and cfg.model.name == "tiny-random" and not cfg.budget.enabled


def test_experiments_do_not_change_the_config_hash():
    base = load_config(PARAMS, "smoke")
    other = base.model_copy(update={"experiments": base.experiments.model_copy(update={"definitions": {}})})
    assert base.hash() == other.hash() and "experiments.definitions" not in base.flat()


@pytest.mark.parametrize("definitions, message", [
    ({"x": {"overrides": ["gspo.eps_lo=1"]}}, "unknown key 'eps_lo' in section gspo"),
    ({"x": {"overrides": ["eval.limit=5"]}}, "eval.* may not vary per experiment"),
    ({"x": {"overrides": ["nosuch.k=5"]}}, "section one of data, model"),
    ({"x": {"overrides": ["gspo.lr"]}}, "expected section.key=value"),
    ({"x": {"extends": "nope"}}, "definitions.x.extends: unknown experiment 'nope'"),
    ({"x": {"extends": "y"}, "y": {"extends": "x"}}, "cycle x -> y -> x"),
    ({"b": {"kind": "baselines", "overrides": ["gspo.lr=1"]}}, "kind 'baselines' takes no overrides"),
    ({"x": {"budget_fraction": 0.5, "overrides": ["budget.target=3"]}}, "do not also override budget.target"),
    ({"x": {"budget_fraction": 0.5}}, "budget_source: 'baselines' must name a kind 'baselines'"),
    ({"Bad-Name": {}}, "names must match"),
    ({"x": {"budget_fraction": 0}}, "budget_fraction"),
])
def test_bad_definitions_name_the_key(tmp_path, definitions, message):
    with pytest.raises(ConfigError) as err:
        load_config(_params(tmp_path, definitions))
    assert message in str(err.value) and "experiments" in str(err.value)


def test_inherited_budget_fraction_conflicts_and_bad_values_name_the_experiment(tmp_path):
    cfg = load_config(_params(tmp_path, {"baselines": {"kind": "baselines"}, "a": {"budget_fraction": 0.5},
                                         "b": {"extends": "a", "overrides": ["budget.target=9"]}}))
    with pytest.raises(ExperimentError, match="definitions.b: inherits budget_fraction"):
        resolve(cfg)
    cfg = load_config(_params(tmp_path, {"x": {"overrides": ["gspo.level=sideways"]}}))
    with pytest.raises(ConfigError, match=r"experiments.definitions.x.overrides.*gspo.level"):
        experiment_config(cfg, resolve(cfg)["x"])


def test_select_orders_and_rejects_unknown_names():
    cfg = load_config(PARAMS)
    assert [e.name for e in select(cfg, ["grpo_token", "baselines"])] == ["baselines", "grpo_token"]
    with pytest.raises(ExperimentError, match=r"unknown experiment\(s\) \['gspo_b10'\].*defined: baselines"):
        select(cfg, ["gspo_b10"])
    with pytest.raises(ExperimentError, match="empty"):
        select(Config())


def _tiny_cfg(**changes) -> Config:
    cfg = load_config(PARAMS, "results", [f"model.name={SETTINGS['model.name']}", "eval.benchmarks=[gsm8k, svamp]"])
    for key, value in changes.items():
        section, field = key.split("__")
        cfg = cfg.model_copy(update={section: getattr(cfg, section).model_copy(update={field: value})})
    return cfg


def test_budget_is_the_matching_per_episode_figure_of_the_untrained_mas():
    base = baselines()  # mas_untrained completion: gsm8k 30000 / 100 items, svamp 24000 / 100 items
    b = budget_from_baseline(base, 0.25, _tiny_cfg(), "results/baselines.json")
    # training questions come from gsm8k/train: the gsm8k figure, in completion tokens (reward.token_measure)
    assert (b.benchmarks, b.figure, b.measure, b.baseline_mean, b.target) == (
        ["gsm8k"], "tokens_completion_mean", "completion", 300.0, 75.0)
    assert b.source == "baselines.json" and b.system == "mas_untrained"
    other = _tiny_cfg(data__train_sources=["math500/test"], reward__token_measure="total")
    b = budget_from_baseline(base, 0.5, other, "baselines.json")
    assert b.benchmarks == ["gsm8k", "svamp"] and b.baseline_mean == 1000.0 and b.target == 500.0
    no_mas = make_results("baselines", {"single_cot": {"gsm8k": cell(0.2, 10)}}, kind="baselines")
    with pytest.raises(ExperimentError, match=r"baselines.json: no 'mas_untrained' system \(has: single_cot\)"):
        budget_from_baseline(no_mas, 0.5, other, "baselines.json")
    for empty in ({**cell(0.0, 0), "n": 0}, cell(0.0, 0)):  # no items, or items that generated nothing
        silent = make_results("baselines", {"mas_untrained": {"gsm8k": empty}}, kind="baselines")
        with pytest.raises(ExperimentError, match=r"no completion tokens on \['gsm8k'\]; cannot set B"):
            budget_from_baseline(silent, 0.5, _tiny_cfg(), "baselines.json")


def test_stale_baselines_file_is_refused():
    cfg = _tiny_cfg()
    assert settings_of(cfg) == {**SETTINGS, "eval.benchmarks": ["gsm8k", "svamp"]}
    check_compatible(baselines(), cfg, "baselines.json")
    with pytest.raises(ExperimentError, match=r"baselines.json: measured under other settings \(mas.rounds: "
                                              r"file 2, now 3\).*--only baselines"):
        check_compatible(baselines(), _tiny_cfg(mas__rounds=3), "baselines.json")


class FakeRunOne:
    """Stands in for training + evaluation: records each experiment's config and writes synthetic numbers."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Config]] = []

    def __call__(self, cfg, exp, *, overrides, budget, data_dir, track=True, log=print, commit=None):
        self.calls.append((exp.name, cfg))
        if exp.kind == "baselines":
            res = baselines()
        else:
            res = make_results(exp.name, {"agent_gspo": {"gsm8k": cell(0.3, 1000)}}, budget_target=None)
        return res.model_copy(update={"overrides": list(overrides), "budget": budget, "settings": settings_of(cfg)})


def test_budgeted_run_without_baselines_runs_them_first_and_says_so(tmp_path, monkeypatch):
    fake = FakeRunOne()
    monkeypatch.setattr(runner_mod, "run_one", fake)
    lines: list[str] = []
    out = runner_mod.run_experiments(_tiny_cfg(), only=["gspo_b25", "grpo_token"], results_dir=tmp_path / "res",
                                     track=False, log=lines.append)
    assert [c[0] for c in fake.calls] == ["baselines", "gspo_b25", "grpo_token"]
    assert [o.name for o in out] == ["baselines", "gspo_b25", "grpo_token"] and out[0].ran_as_dependency
    assert any("baselines.json is missing: running 'baselines' first" in line for line in lines)
    cfgs = dict(fake.calls)
    assert cfgs["gspo_b25"].budget.target == cfgs["grpo_token"].budget.target == 0.25 * 300.0
    assert cfgs["grpo_token"].gspo.level == "token" and cfgs["gspo_b25"].gspo.level == "sequence"
    saved = load_results(tmp_path / "res" / "grpo_token.json")
    assert saved.budget is not None and saved.budget.target == 75.0 and "budget.target=75.0" in saved.overrides
    assert "gspo.level=token" in saved.overrides


def test_limit_and_existing_baselines_file(tmp_path, monkeypatch):
    fake = FakeRunOne()
    monkeypatch.setattr(runner_mod, "run_one", fake)
    res = tmp_path / "res"
    write_results(res / "baselines.json", baselines(mas_tokens=100_000))
    runner_mod.run_experiments(_tiny_cfg(), only=["gspo_b50"], results_dir=res, track=False, log=lambda s: None)
    assert [c[0] for c in fake.calls] == ["gspo_b50"] and fake.calls[0][1].budget.target == 150.0
    with pytest.raises(ExperimentError, match=r"eval.limit: file 100, now 7"):
        runner_mod.run_experiments(_tiny_cfg(), only=["gspo_b50"], limit=7, results_dir=res, track=False,
                                   log=lambda s: None)
    fake.calls.clear()
    runner_mod.run_experiments(_tiny_cfg(), only=["baselines", "lambda0"], limit=7, results_dir=res, track=False,
                               log=lambda s: None)
    assert [(n, c.eval.limit) for n, c in fake.calls] == [("baselines", 7), ("lambda0", 7)]


def test_tracking_uri_is_not_recorded(tmp_path, monkeypatch):
    fake = FakeRunOne()
    monkeypatch.setattr(runner_mod, "run_one", fake)
    runner_mod.run_experiments(_tiny_cfg(), only=["lambda0"], results_dir=tmp_path, track=False, log=lambda s: None,
                               user_overrides=["tracking.uri=postgresql+psycopg://u:secret@db/mlflow"])
    saved = load_results(tmp_path / "lambda0.json")
    assert "tracking.uri=<not recorded>" in saved.overrides and "secret" not in (tmp_path / "lambda0.json").read_text()


def test_cli_run_uses_the_experiments_profile_unless_one_is_given(monkeypatch, capsys):
    import components.experiments as experiments
    from components.cli import main

    seen = []
    monkeypatch.setattr(experiments, "run_experiments", lambda cfg, **kw: seen.append((cfg.profile, kw)) or [])
    monkeypatch.delenv("AGENT_GSPO_PROFILE", raising=False)
    monkeypatch.chdir(ROOT)
    assert main(["experiments", "run", "--only", "lambda0", "--limit", "3", "--no-track"]) == 0
    assert main(["experiments", "run", "--profile", "smoke"]) == 0
    assert [p for p, _ in seen] == ["results", "smoke"]
    assert seen[0][1]["only"] == ["lambda0"] and seen[0][1]["limit"] == 3 and seen[0][1]["track"] is False
