"""The DVC pipelines as committed: the smoke chain at the root, experiments apart, numbers-only
metrics tracked in git, and a dvc.lock that matches the code (the CI check of the lock)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml
from dvc_checks import stage_outputs, stale_lock
from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT


def _stages(rel: str) -> dict:
    return yaml.safe_load((ROOT / rel).read_text())["stages"]


def _paths(entries) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def test_dvc_repro_runs_the_smoke_chain_and_experiments_live_apart() -> None:
    root = _stages("dvc.yaml")
    assert list(root) == ["prepare", "validate", "train", "evaluate"]
    assert "--profile smoke" in root["train"]["cmd"] and "--profile smoke" in root["evaluate"]["cmd"]
    experiments = _stages("experiments/dvc.yaml")
    assert set(experiments) == {"report", "report_cap128", "report_proof_v2", "report_devchoice1"}
    assert all(s["wdir"] == ".." for s in experiments.values())
    for stage in [*root.values(), *experiments.values()]:
        for dep in _paths(stage.get("deps")):  # nothing outside the repository: `dvc exp run --temp` copies it
            assert not dep.startswith(("../", "/")), dep


def test_training_depends_on_the_validation_so_repro_train_validates_first() -> None:
    """`train` depended on data/gsm8k only: `dvc repro train` trained on data that was never validated."""
    root = _stages("dvc.yaml")
    assert set(_paths(root["validate"]["outs"])) & set(_paths(root["train"]["deps"])) == {"reports/validation.md"}


def test_every_declared_output_is_rebuilt_by_dvc_repro() -> None:
    """Only what `dvc repro` rebuilds is an output: the hours-long experiment runs were stages whose outputs
    (the committed results files) were never locked, so `dvc status` listed them as changed forever. Their
    results are plain dependencies of the report stages; their commands are documented at the top."""
    experiments = _stages("experiments/dvc.yaml")
    assert not any(s.get("frozen") for s in experiments.values())
    outs = stage_outputs(ROOT)
    assert not any(o.startswith("results") for o in outs), sorted(outs)
    assert "results" in _paths(experiments["report"]["deps"])
    assert "results/cap128" in _paths(experiments["report_cap128"]["deps"])


def test_every_defined_experiment_has_its_committed_result_and_the_documented_command() -> None:
    """`agent-gspo experiments run --profile results` (documented in experiments/dvc.yaml) writes
    results/<name>.json per definition in params.yaml: every committed result is a definition's, and every
    definition has one at the results profile's cap or in the cap-128 set (the report marks others NOT RUN)."""
    definitions = yaml.safe_load((ROOT / "params.yaml").read_text())["experiments"]["definitions"]
    tracked = subprocess.run(["git", "ls-files", ":(glob)results/*.json", ":(glob)results/cap128/*.json"], cwd=ROOT,
                             capture_output=True, text=True, check=True, timeout=60).stdout.split()
    names = {Path(rel).stem for rel in tracked}
    assert names == set(definitions), names ^ set(definitions)
    text = (ROOT / "experiments" / "dvc.yaml").read_text()
    assert "#   agent-gspo experiments run --profile results\n" in text


def test_the_cap128_set_runs_defined_experiments_into_its_own_folder() -> None:
    """The message-cap sensitivity set (a documented command): every name it runs is a definition with a
    committed result under results/cap128/, and the cap it states is the one it sets."""
    definitions = yaml.safe_load((ROOT / "params.yaml").read_text())["experiments"]["definitions"]
    lines = (ROOT / "experiments" / "dvc.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "--results results/cap128 \\" in line and "run" in line)
    command = " ".join(line.lstrip("# ").rstrip("\\ ") for line in lines[start:start + 5])
    names = command.split("--only ", 1)[1].split()[0].split(",")
    assert set(names) <= set(definitions)
    tracked = set(subprocess.run(["git", "ls-files", "results/cap128"], cwd=ROOT, capture_output=True, text=True,
                                 check=True, timeout=60).stdout.split())
    assert {f"results/cap128/{name}.json" for name in names} <= tracked
    assert "--set mas.max_message_tokens=128" in command and "--set registry.model_name=agent-gspo-results-cap128" \
        in command
    report = _stages("experiments/dvc.yaml")["report_cap128"]
    assert "--results results/cap128" in report["cmd"] and "results/cap128" in _paths(report["deps"])


def _numbers_only(value, where: str) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _numbers_only(inner, f"{where}.{key}")
    else:
        assert isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value), where


def test_metrics_are_small_numbers_only_files_tracked_in_git() -> None:
    metrics = [entry for rel in ("dvc.yaml", "experiments/dvc.yaml") for stage in _stages(rel).values()
               for entry in stage.get("metrics") or []]
    assert len(metrics) == 3  # data, train, eval/: the smoke chain (the experiments' files are plain outputs)
    for entry in metrics:
        (path, opts), = entry.items()
        assert path.startswith("metrics/") and opts == {"cache": False}, entry
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, timeout=30).returncode
        assert ignored == 1, f"{path} is git-ignored: dvc exp show would show '!'"
        for file in [ROOT / path] if (ROOT / path).is_file() else sorted((ROOT / path).glob("*.json")):
            _numbers_only(json.loads(file.read_text()), str(file))
    assert "metrics/eval" in stage_outputs(ROOT)
    for report in ("metrics/experiments.json", "metrics/experiments-cap128.json"):  # tracked in git, numbers only
        assert report in stage_outputs(ROOT)
        assert subprocess.run(["git", "ls-files", "--error-unmatch", report], cwd=ROOT, capture_output=True,
                              timeout=30).returncode == 0, report
        _numbers_only(json.loads((ROOT / report).read_text()), report)


def test_dvc_metrics_show_fits_120_columns() -> None:
    """`dvc metrics show` at the root prints one table: a column per key of every declared metrics file.
    Five files with disjoint keys made it 4,082 characters wide, the experiments' files alone 2,669."""
    res = subprocess.run(["dvc", "metrics", "show"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any(line.startswith("metrics/eval/agent_gspo.json") for line in lines), res.stdout
    assert max(len(line) for line in lines) <= 120, res.stdout


def test_numbers_only_writer_refuses_strings_and_nulls(tmp_path: Path) -> None:
    from components.jobs.metrics import eval_metrics, train_metrics, write_metrics

    with pytest.raises(ValueError, match=r"x.json.a.sha: 'abc' is not a finite number"):
        write_metrics(tmp_path / "x.json", {"a": {"sha": "abc"}})
    summary = {"agent_gspo": {"accuracy": 0.5, "tokens_total_mean": 10, "tokens_per_correct": None, "benchmarks": 2}}
    assert eval_metrics(summary) == {"agent_gspo": {"accuracy": 0.5, "tokens": 10}}
    history = [{"step": 1, "train/reward": 0.1, "perf/step_s": 3.0}, {"step": 2, "train/reward": 0.2}]
    assert train_metrics(history) == {"n": 2, "reward": 0.2, "noop": 0}


@pytest.mark.slow
def test_committed_dvc_lock_matches_the_code_and_params() -> None:
    problems = stale_lock(ROOT)
    assert not problems, ("dvc.lock does not match the code/params; regenerate with "
                          "`dvc repro && git add dvc.lock metrics`:\n  " + "\n  ".join(problems))
