"""The study apart from the product: its schema validates params.yaml's ``experiments`` section in every
profile (a typo is an error naming the key), ``agent-gspo experiments ...`` reaches the study without the
product importing it, bad options exit 2 before anything is written, and the DVC stages depend on every
module of the study."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.paths import REPO_ROOT

import components.cli as product_cli
from components.config import ConfigError, load_config
from experiments.cli import main
from experiments.schema import study_section

ROOT = REPO_ROOT
PARAMS = ROOT / "params.yaml"


def _profiles() -> list[str]:
    return ["default", *yaml.safe_load(PARAMS.read_text())["profiles"]]


@pytest.mark.parametrize("profile", _profiles())
def test_params_experiments_section_validates_under_the_study_schema_in_every_profile(profile: str) -> None:
    study = study_section(load_config(PARAMS, profile))
    assert study.record.rules == "v2" and study.definitions


@pytest.mark.parametrize(("override", "key"), [
    ("experiments.last_kk=3", "experiments.last_kk: unknown key"),
    ("experiments.record.b52=gspo_b25", "experiments.record.b52: unknown key"),
    ("experiments.definitions.gspo_b25.budget_fractoin=0.3", "experiments.definitions.gspo_b25.budget_fractoin"),
    ("experiments.last_k=0", "experiments.last_k: Input should be greater than or equal to 1"),
])
def test_a_typo_in_the_experiments_section_is_an_error_naming_the_key(override: str, key: str) -> None:
    cfg = load_config(PARAMS, "results", [override])  # the product keeps the section opaque
    with pytest.raises(ConfigError, match="profile results") as err:
        study_section(cfg)
    assert key in str(err.value)


def test_the_product_still_rejects_a_typo_in_its_own_sections() -> None:
    with pytest.raises(ConfigError, match=r"gspo.stpes: unknown key"):
        load_config(PARAMS, "results", ["gspo.stpes=3"])


def test_agent_gspo_experiments_execs_the_study_without_importing_it(monkeypatch) -> None:
    calls = []

    def fake_execve(path, argv, env):
        calls.append((path, argv, env))
        raise SystemExit(0)

    monkeypatch.setattr(product_cli.os, "execve", fake_execve)
    with pytest.raises(SystemExit):
        product_cli.main(["experiments", "report", "--results", "x"])
    path, argv, env = calls[0]
    assert path == sys.executable and argv[1:] == ["-m", "experiments", "report", "--results", "x"]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)


def test_agent_gspo_experiments_forwards_exit_codes_and_messages(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    env = dict(os.environ, AGENT_GSPO_PROFILE="")
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "components.cli", "experiments", "report", "--results",
                           str(tmp_path / "nope"), "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(env, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "agent-gspo experiments: error:" in done.stderr and "results folder not found" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


@pytest.mark.parametrize("argv", [["run", "--only", ","], ["report", "--results", "/nonexistent/results"]])
def test_study_options_outside_the_schema_exit_2_with_one_message(argv, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "report.md"
    argv = [*argv, "--out", str(out)] if argv[0] == "report" else argv
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "error:" in err, err
    assert not out.exists()  # a mistyped results folder must not overwrite the report


def test_every_selected_experiment_is_validated_before_the_first_runs(tmp_path, capsys, monkeypatch) -> None:
    """A bad override value in the last experiment fails at once, not after hours of the others."""
    raw = yaml.safe_load(PARAMS.read_text())
    raw["experiments"]["definitions"] = {"baselines": {"kind": "baselines"}, "broken": {"overrides": ["gspo.steps=-5"]}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--params", str(params), "--results", str(tmp_path / "res"), "--no-track"])
    err = capsys.readouterr().err
    assert code == 2 and "experiments.definitions.broken.overrides" in err and "gspo.steps" in err, err
    assert not (tmp_path / "res").exists() and not (tmp_path / "runs").exists()


def _digests(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def project(tmp_path: Path, monkeypatch) -> Path:
    """A params file whose data folder holds a manifest; a results folder; cwd = tmp_path."""
    raw = yaml.safe_load(PARAMS.read_text())
    raw["data"]["out_dir"], raw["data"]["mirror"] = "data", "mirror"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}\n")
    os.link(tmp_path / "params.yaml", tmp_path / "hard.yaml")
    (tmp_path / "results").mkdir()
    shutil.copy(ROOT / "results" / "baselines.json", tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("argv", "option"), [
    (["report", "--results", "{p}/results", "--out", "{p}/data/report.md"], "--out"),
    (["report", "--results", "{p}/results", "--metrics", "{p}/hard.yaml"], "--metrics"),
    (["run", "--only", "baselines", "--no-track", "--results", "{p}/data"], "--results"),
    (["run", "--only", "baselines", "--no-track", "--results", "{p}/data/manifest.json"], "--results"),
    (["run", "--only", "baselines", "--no-track", "--results", str(ROOT / "components")], "--results"),
])
def test_each_output_option_refuses_a_pipeline_input_exit_2_and_writes_nothing(project: Path, capsys, monkeypatch,
                                                                                argv: list[str], option: str) -> None:
    import experiments.runner as runner_mod

    monkeypatch.setattr(runner_mod, "run_one", lambda *a, **k: pytest.fail("work started"))
    before = _digests(project)
    args = [a.replace("{p}", str(project)) for a in argv]
    assert main([*args, "--params", str(project / "params.yaml")]) == 2
    err = capsys.readouterr().err
    target = args[args.index(option) + 1]
    assert f"{target}: is " in err and "an input of the pipeline" in err, err
    assert _digests(project) == before


def test_the_report_stages_depend_on_every_module_of_the_study() -> None:
    """File by file (the folder would hold the pipeline's own dvc.lock): a new module must be listed."""
    stages = yaml.safe_load((ROOT / "experiments" / "dvc.yaml").read_text())["stages"]
    modules = {f"experiments/{p.name}" for p in (ROOT / "experiments").glob("*.py")}
    for name, stage in stages.items():
        deps = {d if isinstance(d, str) else next(iter(d)) for d in stage["deps"]}
        assert modules <= deps, f"{name}: not a dependency: {sorted(modules - deps)}"
        assert stage["cmd"].startswith(("python -m experiments report ", "python -m experiments proof-report ",
                                        "python -m experiments devchoice-report "))


def test_params_lists_every_key_of_the_study_schema_and_its_numbers_are_bounded() -> None:
    import annotated_types as at

    from experiments.schema import ExperimentDef, ExperimentsConfig, RecordConfig

    raw = yaml.safe_load(PARAMS.read_text())["experiments"]
    assert set(ExperimentsConfig.model_fields) <= set(raw) and set(RecordConfig.model_fields) <= set(raw["record"])
    for model, name in ((ExperimentsConfig, "last_k"), (ExperimentDef, "budget_fraction")):
        meta = model.model_fields[name].metadata
        assert any(isinstance(m, at.Ge | at.Gt) for m in meta) and any(isinstance(m, at.Le | at.Lt) for m in meta)


def test_keys_lists_the_study_schema(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["keys"]) == 0
    out = capsys.readouterr().out
    assert "experiments.record.rules" in out and "experiments.definitions.<name>.budget_fraction" in out
