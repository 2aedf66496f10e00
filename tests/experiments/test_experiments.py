"""Experiment definitions (params.yaml -> experiments), the budget B from the trainer's calibration,
and the runner's wiring (what each experiment runs with) with a fake in place of training."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.experiments_fixtures import SETTINGS, baselines, cell, make_results  # noqa: E402
from helpers.paths import REPO_ROOT

from components.config import Config, ConfigError, load_config  # noqa: E402
from experiments import runner as runner_mod  # noqa: E402
from experiments.definitions import (  # noqa: E402  # noqa: E402
    ExperimentError,
    budget_from_calibration,
    experiment_config,
    read_calibration,
    resolve,
    select,
    settings_diff,
    settings_of,
)
from experiments.results import load_results  # noqa: E402
from experiments.runner import RunRequest  # noqa: E402
from experiments.schema import study_section  # noqa: E402

ROOT = REPO_ROOT
PARAMS = ROOT / "params.yaml"
NAMES = ["baselines", "gspo_b50", "gspo_b25", "lambda0", "no_adv_norm", "grpo_token", "gspo_b25_choice",
         "gspo_b25_code", "gspo_b25_answer", "gspo_b25_mc_answer", "gspo_b25_mix_answer", "gspo_b25_mix_answer_s1",
         "lambda0_answer", "lambda0_mix_answer", "gspo_b50_mix_answer", "no_adv_norm_mix_answer",
         "grpo_token_mix_answer", "silence_proof"]


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
            cfg = experiment_config(base, exp)
            assert cfg.budget.fraction == exp.budget_fraction
            assert cfg.gspo.out_dir == str(Path(study_section(base).runs_dir) / exp.name)
            assert cfg.eval == base.eval.model_copy(update={"out_dir": str(Path(cfg.gspo.out_dir) / "eval")})
    base = load_config(PARAMS, "results")
    exps = resolve(base)
    assert exps["baselines"].kind == "baselines" and exps["gspo_b50"].budget_fraction == 0.5
    assert exps["grpo_token"].budget_fraction == 0.25 and exps["no_adv_norm"].budget_fraction == 0.25
    grpo = experiment_config(base, exps["grpo_token"])
    assert grpo.gspo.level == "token" and grpo.budget.fraction == 0.25 and grpo.budget.enabled
    assert experiment_config(base, exps["no_adv_norm"]).gspo.adv_norm == "none"
    choice = experiment_config(base, exps["gspo_b25_choice"])  # gspo_b25 + answerable questions + a λ ceiling
    assert choice.data.train_sources == ["mmlu/val", "aqua/dev"] and choice.budget.fraction == 0.25
    assert choice.budget.lambda_max == 0.1 and choice.budget.mode == "cap" and choice.gspo.grad_accum == 2
    same = {"data": base.data, "gspo": base.gspo, "eval": base.eval, "budget": base.budget}
    assert choice.model_copy(update=same) == experiment_config(base, exps["gspo_b25"]).model_copy(update=same)
    b25 = experiment_config(base, exps["gspo_b25"])
    assert choice.gspo.model_copy(update={"grad_accum": 1, "out_dir": b25.gspo.out_dir}) == b25.gspo
    lam = experiment_config(base, exps["lambda0"])
    assert (lam.reward.lambda_tok, lam.budget.enabled, lam.reward.lambda_turn, lam.reward.lambda_rep) == (
        0, False, 0, 0)
    # the results profile: SmolLM2, 3 agents x 2 rounds, 64-token messages, 100 items
    assert (base.model.name, base.mas.agents, base.mas.rounds, base.mas.max_message_tokens, base.eval.limit) == (
        "smollm2-135m-instruct", 3, 2, 64, 100)


def test_user_overrides_win_over_the_definition():
    base = load_config(PARAMS, "results")
    exp = resolve(base)["lambda0"]
    cfg = experiment_config(base, exp, user_overrides=["reward.lambda_tok=0.5", "model.name=tiny-random"])
    assert cfg.reward.lambda_tok == 0.5 and cfg.model.name == "tiny-random" and not cfg.budget.enabled


def test_experiments_do_not_change_the_config_hash():
    base = load_config(PARAMS, "smoke")
    other = base.model_copy(update={"experiments": {**base.experiments, "definitions": {}}})
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
    ({"x": {"budget_fraction": 0.5, "overrides": ["budget.fraction=3"]}}, "do not also override budget.target"),
    ({"Bad-Name": {}}, "names must match"),
    ({"x": {"budget_fraction": 0}}, "budget_fraction"),
])
def test_bad_definitions_name_the_key(tmp_path, definitions, message):
    with pytest.raises(ConfigError) as err:
        study_section(load_config(_params(tmp_path, definitions)))
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


CALIBRATION = {"episodes": 32.0, "fraction": 0.25, "measure": "completion", "target": 75.0, "untrained_mean": 300.0}


def test_budget_is_the_trainers_calibration_on_sampled_training_episodes(tmp_path):
    b = budget_from_calibration(CALIBRATION, _tiny_cfg(), "runs/x/metrics.json")
    # training questions come from gsm8k/train; the measure is reward.token_measure, as the trainer counts it
    assert (b.benchmarks, b.measure, b.baseline_mean, b.target, b.fraction) == (["gsm8k"], "completion", 300.0,
                                                                                 75.0, 0.25)
    assert b.figure == "mean of 32 sampled training episodes" and b.system == "policy before step 1"
    with pytest.raises(ExperimentError, match=r"runs/x/metrics.json: no budget_calibration"):
        budget_from_calibration(None, _tiny_cfg(), "runs/x/metrics.json")
    with pytest.raises(ExperimentError, match=r"runs/x/metrics.json: budget_calibration is malformed"):
        budget_from_calibration({**CALIBRATION, "measure": "words"}, _tiny_cfg(), "runs/x/metrics.json")
    assert read_calibration(tmp_path) is None
    (tmp_path / "metrics.json").write_text('{"budget_calibration": {"target": 75.0}}')
    assert read_calibration(tmp_path) == {"target": 75.0}


def test_settings_diff_names_each_key():
    cfg = _tiny_cfg()
    assert settings_of(cfg) == {**SETTINGS, "mas.max_message_tokens": 64, "mas.context_tokens": 384,
                                "eval.benchmarks": ["gsm8k", "svamp"]}
    assert settings_diff(settings_of(cfg), settings_of(cfg)) == []
    assert settings_diff(settings_of(cfg), settings_of(_tiny_cfg(mas__rounds=3))) == ["mas.rounds: 2 vs 3"]


class FakeRunOne:
    """Stands in for training + evaluation: records each experiment's config and writes synthetic numbers
    (a budgeted run gets the budget its trainer would have calibrated: fraction x 300 tokens)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Config]] = []
        self.resumes: list[bool] = []

    def __call__(self, cfg, exp, overrides, ctx, resume=False):
        self.calls.append((exp.name, cfg))
        self.resumes.append(resume)
        if exp.kind == "baselines":
            res = baselines()
        else:
            res = make_results(exp.name, {"agent_gspo": {"gsm8k": cell(0.3, 1000)}}, budget_target=None)
        budget = None
        if cfg.budget.fraction is not None:
            cal = {**CALIBRATION, "fraction": cfg.budget.fraction, "target": cfg.budget.fraction * 300.0}
            budget = budget_from_calibration(cal, cfg, "fake")
        return res.model_copy(update={"overrides": list(overrides), "budget": budget, "settings": settings_of(cfg)})


def test_budgeted_runs_calibrate_b_themselves_without_the_baselines(tmp_path, monkeypatch):
    fake = FakeRunOne()
    monkeypatch.setattr(runner_mod, "run_one", fake)
    lines: list[str] = []
    out = runner_mod.run_experiments(_tiny_cfg(), RunRequest(only=["gspo_b25", "grpo_token", "lambda0"],
                                     results_dir=tmp_path / "res", track=False, log=lines.append))
    assert [c[0] for c in fake.calls] == ["gspo_b25", "lambda0", "grpo_token"]  # declaration order, no baselines
    assert [o.name for o in out] == ["gspo_b25", "lambda0", "grpo_token"]
    cfgs = dict(fake.calls)
    assert cfgs["gspo_b25"].budget.fraction == cfgs["grpo_token"].budget.fraction == 0.25
    assert cfgs["lambda0"].budget.fraction is None and not cfgs["lambda0"].budget.enabled
    assert cfgs["grpo_token"].gspo.level == "token" and cfgs["gspo_b25"].gspo.level == "sequence"
    saved = load_results(tmp_path / "res" / "grpo_token.json")
    assert saved.budget is not None and saved.budget.target == 75.0 and "budget.fraction=0.25" in saved.overrides
    assert "gspo.level=token" in saved.overrides and not (tmp_path / "res" / "baselines.json").exists()


def test_limit_reaches_every_experiment(tmp_path, monkeypatch):
    fake = FakeRunOne()
    monkeypatch.setattr(runner_mod, "run_one", fake)
    runner_mod.run_experiments(_tiny_cfg(), RunRequest(only=["baselines", "gspo_b50"], limit=7,
                                                        results_dir=tmp_path,
                               track=False, log=lambda s: None))
    assert [(n, c.eval.limit, c.budget.fraction) for n, c in fake.calls] == [("baselines", 7, None),
                                                                             ("gspo_b50", 7, 0.5)]


def test_tracking_uri_is_not_recorded(tmp_path, monkeypatch):
    fake = FakeRunOne()
    monkeypatch.setattr(runner_mod, "run_one", fake)
    runner_mod.run_experiments(_tiny_cfg(), RunRequest(only=["lambda0"], results_dir=tmp_path, track=False,
                                                        log=lambda s: None,
                               user_overrides=["tracking.uri=postgresql+psycopg://u:secret@db/mlflow"]))
    saved = load_results(tmp_path / "lambda0.json")
    assert "tracking.uri=<not recorded>" in saved.overrides and "secret" not in (tmp_path / "lambda0.json").read_text()


def test_resume_reaches_the_gspo_experiments_and_a_proof_experiment_says_it_starts_over(tmp_path, monkeypatch):
    fake = FakeRunOne()
    monkeypatch.setattr(runner_mod, "run_one", fake)

    class ProofStarted(Exception):
        pass

    def proof_starts(*args, **kwargs):
        raise ProofStarted

    monkeypatch.setattr(runner_mod, "run_proof", proof_starts)
    logs: list[str] = []
    with pytest.raises(ProofStarted):
        runner_mod.run_experiments(_tiny_cfg(), RunRequest(only=["lambda0", "silence_proof"], results_dir=tmp_path,
                                                            track=False,
                                   log=logs.append, resume=True, params=str(PARAMS)))
    assert [n for n, _ in fake.calls] == ["lambda0"] and fake.resumes == [True]
    assert "[silence_proof] --resume applies to gspo experiments only: a proof experiment trains from scratch" in logs
    runner_mod.run_experiments(_tiny_cfg(), RunRequest(only=["lambda0"], results_dir=tmp_path, track=False,
                                                        log=logs.append))
    assert fake.resumes == [True, False]  # off unless asked


def test_cli_run_uses_the_experiments_profile_unless_one_is_given(monkeypatch, capsys):
    import experiments.jobs as jobs
    from experiments.cli import main

    seen = []
    monkeypatch.setattr(jobs, "run_experiments", lambda cfg, req: seen.append((cfg.profile, req)) or [])
    monkeypatch.delenv("AGENT_GSPO_PROFILE", raising=False)
    monkeypatch.chdir(ROOT)
    assert main(["run", "--only", "lambda0", "--limit", "3", "--no-track"]) == 0
    assert main(["run", "--profile", "smoke"]) == 0
    assert [p for p, _ in seen] == ["results", "smoke"]
    assert seen[0][1].only == ["lambda0"] and seen[0][1].limit == 3 and seen[0][1].track is False
