"""Every scheduled search runs trials: two weeks of ``search_flow`` with ``run_root`` (what the
``weekly-search`` deployment passes), each in a study of its own, against a real ``prefect server``.

Was: both weeks opened ``search.study_name`` (``agent-gspo``) in ``search.storage``
(``sqlite:///optuna.db``) with ``load_if_exists``. Week 2 found week 1's study recorded under another
config (its run folder's output paths differ) and FAILED (ConfigMismatchError, exit 2); under the same
config it would have found the study finished and run no trial. The weekly schedule did nothing after
week 1. Now a run with a run folder searches in
``<search.study_name>-<folder name>`` (flows/run_folders.py:study_override); ``agent-gspo search``
by hand keeps the plain name (tests/unit/flows/test_run_folder_names.py). Real trials: the tiny
random model, one GSPO step and one dev item per dev benchmark, one trial per week.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from helpers.paths import REPO_ROOT
from helpers.servers import mlflow_template_db, prefect_server
from mlflow import MlflowClient

from components.search.candidate import STUDY_BASELINE

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO_ROOT
TINY = ["model.name=tiny-random", "search.trials=1", "search.trial_steps=1", "search.dev_items=1"]

TWO_WEEKS = """
import json, sys
from flows.pipeline import search_flow

for week in (1, 2):
    state = search_flow(params=sys.argv[1], profile="smoke", overrides=json.loads(sys.argv[2]),
                        run_root="runs/scheduled", return_state=True)
    print("WEEK", week, state.type.value, flush=True)
"""


def test_two_scheduled_weeks_each_search_their_own_fresh_study(tmp_path: Path, prepared_data: Path,
                                                                request: pytest.FixtureRequest) -> None:
    cache = request.config.cache
    mlflow_db = tmp_path / "mlflow.db"
    mlflow_db.write_bytes(mlflow_template_db(Path(cache.mkdir("agent-gspo-mlflow")) if cache
                                             else tmp_path / "template").read_bytes())
    overrides = [*TINY, f"data.out_dir={prepared_data}", f"tracking.uri=sqlite:///{mlflow_db}"]
    work = tmp_path / "home"  # the checkout a worker runs in: the default sqlite:///optuna.db lands here
    work.mkdir()
    with prefect_server(tmp_path / "prefect") as server:
        env = {**server.client_env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run([sys.executable, "-c", TWO_WEEKS, str(ROOT / "params.yaml"), json.dumps(overrides)],
                              cwd=work, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.returncode == 0, log
    assert [line for line in proc.stdout.splitlines() if line.startswith("WEEK")] == [
        "WEEK 1 COMPLETED", "WEEK 2 COMPLETED"], log

    folders = sorted((work / "runs" / "scheduled" / "agent-gspo-search").iterdir())
    summaries = [json.loads((folder / "search.json").read_text()) for folder in folders]
    names = [s["study"] for s in summaries]
    assert len(folders) == 2 and names == [f"agent-gspo-{folder.name}" for folder in folders], (names, log)
    assert all(s["storage"] == "sqlite:///optuna.db" and s["candidate"] == [] for s in summaries)

    storage = f"sqlite:///{work / 'optuna.db'}"
    assert sorted(s.study_name for s in optuna.get_all_study_summaries(storage)) == names  # none named agent-gspo
    for name in names:  # each week ran its trial and judged it against its own baseline
        study = optuna.load_study(study_name=name, storage=storage)
        assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE], (name, log)
        assert STUDY_BASELINE in study.user_attrs, name
    assert not (work / "search" / "best_params.yaml").exists()  # a tie on tiny-random is no candidate

    client = MlflowClient(f"sqlite:///{mlflow_db}")
    runs = client.search_runs([client.get_experiment_by_name("agent-gspo").experiment_id])
    parents = [r for r in runs if r.data.tags.get("stage") == "search"]
    assert sorted(r.data.tags["study"] for r in parents) == names
    for parent in parents:
        trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert [(r.info.run_name, r.data.tags["study"]) for r in trials] == [("trial-0", parent.data.tags["study"])]
