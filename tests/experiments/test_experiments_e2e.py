"""End to end through the CLI: `experiments run --only baselines,gspo_b25` with the tiny random model,
then `experiments report`; the report's table must show exactly the numbers in the results files."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT, find_under_tests

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = REPO_ROOT


def _template_db(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The migrated empty MLflow DB of tests/unit/tracking/test_tracking_helpers.py (copied: migrating
    takes seconds)."""
    spec = importlib.util.spec_from_file_location("test_tracking_helpers",
                                                  find_under_tests("test_tracking_helpers.py"))
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)  # type: ignore[union-attr]
    cache = getattr(request.config, "cache", None)
    folder = Path(cache.mkdir("agent-gspo-mlflow")) if cache is not None else tmp_path / "template"
    return helpers.template_db(folder)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", AGENT_GSPO_PROFILE="")
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "components.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def test_run_baselines_and_gspo_b25_then_report(prepared_data, tmp_path, request):
    db = tmp_path / "mlflow.db"
    shutil.copy(_template_db(request, tmp_path), db)
    results, docs = tmp_path / "results", tmp_path / "docs" / "results.md"
    tiny = ["model.name=tiny-random", "gspo.steps=1", "gspo.engine=torch", "gspo.minibatches=1", "gspo.grad_accum=1",
            "mas.max_message_tokens=8", "mas.context_tokens=128", "eval.benchmarks=[gsm8k, multiarith]",
            "eval.self_consistency_k=2", "eval.batch_size=2", f"data.out_dir={prepared_data}",
            f"tracking.uri=sqlite:///{db}", f"experiments.runs_dir={tmp_path / 'runs'}"]
    sets = [a for t in tiny for a in ("--set", t)]
    run = _cli("experiments", "run", "--profile", "results", "--only", "baselines,gspo_b25", "--limit", "2",
               "--results", str(results), *sets)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "baselines" in run.stdout and "gspo_b25" in run.stdout

    base = json.loads((results / "baselines.json").read_text())
    b25 = json.loads((results / "gspo_b25.json").read_text())
    assert set(base["eval"]) == {"single_cot", "self_consistency", "mas_untrained", "mas_prior"}
    assert base["self_consistency_k"] == 2 and b25["self_consistency_k"] is None
    assert set(b25["eval"]) == {"agent_gspo"} and len(b25["history"]) == 1
    # what it ran on: the subprocess's fingerprint (this machine; its torch threads as it set them)
    for res in (base, b25):
        assert res["machine"]["cores"] >= 1 and res["machine"]["torch"] and "cpu_flags" in res["machine"]
    # held-out silence per (agent, round) of each multi-agent system: messages sent add up to the table's
    assert set(base["silence"]) == {"mas_untrained", "mas_prior"} and set(b25["silence"]) == {"agent_gspo"}
    for res, system in ((base, "mas_untrained"), (b25, "agent_gspo")):
        sent = sum(map(sum, res["silence"][system]["sent"]))
        cells = res["eval"][system].values()
        assert sent == pytest.approx(sum(c["messages"] * c["n"] for c in cells)), system
        # per benchmark and by condition (issue 52): the grids add up to the pooled one; a simultaneous
        # round 0 is taken before any answer, every one of its turns
        by_bench, content = res["silence"][system]["by_benchmark"], res["silence"][system]["content"]
        assert set(by_bench) == {"gsm8k", "multiarith"}
        assert sum(sum(map(sum, g["sent"])) for g in by_bench.values()) == sent
        assert content["turn_order"] == "simultaneous" and content["round0_after_answer"] == [[0, 0]] * 3
        assert [p[1] for p in content["round0_no_answer"]] == [row[0] for row in res["silence"][system]["sent"]]
    assert base["item_ids_sha256"] == b25["item_ids_sha256"] and b25["limit"] == 2
    # B: the trainer's calibration on sampled gsm8k training episodes of the untrained policy, before step 1
    cal = json.loads((tmp_path / "runs" / "gspo_b25" / "metrics.json").read_text())["budget_calibration"]
    assert b25["budget"]["target"] == pytest.approx(0.25 * cal["untrained_mean"]) == pytest.approx(cal["target"])
    assert b25["budget"]["system"] == "policy before step 1" and b25["budget"]["benchmarks"] == ["gsm8k"]
    assert "budget.fraction=0.25" in b25["overrides"]
    assert b25["history"][0]["train/budget"] == pytest.approx(b25["budget"]["target"])
    assert (tmp_path / "runs" / "gspo_b25" / "final" / "config.json").exists()

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("agent-gspo-results")
    tagged = client.search_runs([exp.experiment_id], "tags.`experiment.name` = 'gspo_b25'")
    assert {r.info.run_id for r in tagged} == {b25["mlflow"]["train_run_id"], b25["mlflow"]["eval_run_id"]}

    rep = _cli("experiments", "report", "--results", str(results), "--out", str(docs))
    assert rep.returncode == 0, rep.stderr
    md = docs.read_text()
    for name in ("accuracy_vs_tokens", "lambda_tok", "tokens_vs_budget", "reward", "silence"):
        assert (docs.parent / "results" / f"{name}.png").stat().st_size > 0
    rows = {line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| ") and " | " in line}
    for label, data, system in (("Agent-GSPO B25", b25, "agent_gspo"), ("untrained MAS (free-for-all)", base,
                                                                        "mas_untrained")):
        row = next(line for line in md.splitlines() if line.startswith(f"| {label} |"))
        for bench in ("gsm8k", "multiarith"):
            c = data["eval"][system][bench]
            assert f"{c['accuracy']:.3f} ± {c['accuracy_se']:.3f} / {c['tokens_total']}" in row
    assert rows and "| Agent-GSPO B50 | gspo_b50 | not run" in md
    assert "## Held-out silence per agent and round" in md and "| Agent-GSPO B25 | gspo_b25 | " in md
    assert "## Collapse or strategic silence?" in md and "agent 2: round 0 before any answer" in md
    assert "self-consistency votes over k = 2 samples" in md
    assert "(c) Mean tokens tracked the budget" in md and "(b) λ = 0 uses at least 2x" in md


def test_silence_proof_runs_four_systems_and_reports(prepared_data, tmp_path):
    """`experiments run --only silence_proof` (tiny model, 2 steps per run) writes one proof file with
    the untrained, prior-only, budgeted and λ=0 systems on the same held-out items; the report shows
    its table and a verdict for each target."""
    results, docs = tmp_path / "results", tmp_path / "docs" / "results.md"
    tiny = ["model.name=tiny-random", "gspo.steps=2", "gspo.group_size=2", "gspo.questions_per_step=1",
            "mas.max_message_tokens=6", "mas.context_tokens=128", "budget.calibration_questions=1",
            "eval.batch_size=4", f"data.out_dir={prepared_data}", f"experiments.runs_dir={tmp_path / 'runs'}"]
    sets = [a for t in tiny for a in ("--set", t)]
    run = _cli("experiments", "run", "--only", "silence_proof", "--limit", "4", "--results", str(results),
               "--no-track", *sets)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    proof = json.loads((results / "silence_proof.json").read_text())
    assert proof["kind"] == "proof" and set(proof["eval"]) == {"mas_untrained", "mas_prior", "agent_gspo", "lambda0"}
    assert all(len(v) == 4 for v in proof["correct"].values()) and set(proof["runs"]) == {"agent_gspo", "lambda0"}
    assert proof["machine"]["cores"] >= 1 and proof["machine"]["torch"]
    cal = proof["runs"]["agent_gspo"]["budget_calibration"]
    import yaml

    fraction = yaml.safe_load((ROOT / "params.yaml").read_text())["experiments"]["definitions"]["silence_proof"][
        "budget_fraction"]
    assert cal["target"] == pytest.approx(cal["fraction"] * cal["untrained_mean"]) and cal["fraction"] == fraction
    assert proof["runs"]["lambda0"]["budget_calibration"] is None
    assert proof["runs"]["agent_gspo"]["history"][0]["train/budget"] == pytest.approx(cal["target"])
    assert proof["eval"]["agent_gspo"]["splitinfo"]["silence_uninformed"] is not None

    rep = _cli("experiments", "report", "--results", str(results), "--out", str(docs))
    assert rep.returncode == 0, rep.stderr
    md = docs.read_text()
    assert "## Silence proof (silence_proof)" in md and "| Agent-GSPO (budget) |" in md
    for key in ("P1", "P2", "P3", "P4", "P5"):
        assert f"### ({key})" in md
    assert (docs.parent / "results" / "proof_silence.png").stat().st_size > 0
