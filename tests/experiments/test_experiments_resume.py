"""`experiments run --resume` through the CLI with the tiny random model: a gspo experiment whose
training was interrupted after a checkpoint continues from it (its history keeps the steps before),
one interrupted during its evaluation only evaluates again, one whose checkpoint was written under
another config is refused by name, and without --resume the experiment starts over."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers.paths import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = REPO_ROOT


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", AGENT_GSPO_PROFILE="")
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "components.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def test_resume_continues_an_interrupted_training_and_refuses_another_config(prepared_data, tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    tiny = ["model.name=tiny-random", "gspo.steps=2", "gspo.checkpoint_every=1", "gspo.keep_checkpoints=2",
            "gspo.engine=torch", "gspo.minibatches=1", "gspo.grad_accum=1", "mas.max_message_tokens=8",
            "mas.context_tokens=128", "eval.benchmarks=[gsm8k]", "eval.batch_size=2",
            f"data.out_dir={prepared_data}", f"experiments.runs_dir={runs}"]
    sets = [a for t in tiny for a in ("--set", t)]
    args = ("experiments", "run", "--profile", "results", "--only", "gspo_b25", "--limit", "2", "--no-track",
            "--results", str(results), *sets)
    first = _cli(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    done = json.loads((results / "gspo_b25.json").read_text())
    assert len(done["history"]) == 2 and done["resumed_from_step"] is None

    # an interruption after the step-1 checkpoint: step 2's checkpoint and the run's outputs never written
    run = runs / "gspo_b25"
    shutil.rmtree(run / "checkpoints" / "step-000002")
    for name in ("final", "metrics.json", "history.json", "plots"):
        path = run / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    (results / "gspo_b25.json").unlink()

    refused = _cli(*args, "--resume", "--set", "reward.lambda_tok=0.5")
    assert refused.returncode != 0
    assert "different config" in refused.stderr and "lambda_tok" in refused.stderr, refused.stderr[-2000:]
    assert not (results / "gspo_b25.json").exists()
    assert (run / "checkpoints" / "step-000001").is_dir()  # nothing of the interrupted run was deleted

    resumed = _cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming training from step 1" in resumed.stdout
    res = json.loads((results / "gspo_b25.json").read_text())
    assert res["resumed_from_step"] == 1 and len(res["history"]) == 2
    assert res["history"][0] == done["history"][0]  # the step before the checkpoint, as it was logged
    assert res["budget"] == done["budget"]  # B as the first run measured it before step 1
    assert (run / "final" / "config.json").exists()

    # interrupted during the evaluation: the last step's checkpoint is there, no results file; nothing to train
    (results / "gspo_b25.json").unlink()
    evaluated = _cli(*args, "--resume")
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    assert "resuming training from step 2" in evaluated.stdout
    last = json.loads((results / "gspo_b25.json").read_text())
    assert last["resumed_from_step"] == 2 and last["history"] == res["history"]

    again = _cli(*args)  # without --resume: from scratch, as before
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming" not in again.stdout
    assert json.loads((results / "gspo_b25.json").read_text())["resumed_from_step"] is None


def test_resume_on_baselines_evaluates_only_the_added_system(prepared_data, tmp_path):
    """The real path: the tiny model's single_cot file, then mas_prior added with --resume; the kept
    system's numbers are the first run's, byte for byte, and a changed setting is refused."""
    results = tmp_path / "results"
    tiny = ["model.name=tiny-random", "mas.max_message_tokens=8", "mas.context_tokens=128",
            "eval.benchmarks=[gsm8k]", "eval.batch_size=2", f"data.out_dir={prepared_data}"]
    sets = [a for t in tiny for a in ("--set", t)]
    args = ("experiments", "run", "--profile", "results", "--only", "baselines", "--limit", "2", "--no-track",
            "--results", str(results), *sets)
    first = _cli(*args, "--set", "eval.baselines=[single_cot]")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    one = json.loads((results / "baselines.json").read_text())

    refused = _cli(*args, "--resume", "--set", "eval.baselines=[single_cot, mas_prior]", "--set", "mas.rounds=3")
    assert refused.returncode != 0 and "mas.rounds: 2 vs 3" in refused.stderr, refused.stderr[-2000:]
    assert json.loads((results / "baselines.json").read_text()) == one

    added = _cli(*args, "--resume", "--set", "eval.baselines=[single_cot, mas_prior]")
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    assert "keeping single_cot" in added.stdout and "evaluating mas_prior" in added.stdout
    both = json.loads((results / "baselines.json").read_text())
    assert set(both["eval"]) == {"single_cot", "mas_prior"} and set(both["silence"]) == {"mas_prior"}
    for key in ("eval", "items", "summary"):
        assert both[key]["single_cot"] == one[key]["single_cot"], key
    assert both["carried"] == [{"systems": ["single_cot"], "git_commit": one["git_commit"],
                                "config_hash": one["config_hash"], "overrides": one["overrides"],
                                "eval_run_id": None, "eval_seconds": one["eval_seconds"]}]
    assert both["item_ids_sha256"] == one["item_ids_sha256"] and both["config_hash"] != one["config_hash"]
