"""A scheduled run never touches DVC's outputs: the nightly deployment of prefect.yaml, run by a real
``prefect worker`` against a real ``prefect server`` on 127.0.0.1, in a fresh copy of the checkout.

Was: the nightly run trained with ``--overwrite`` into ``runs/smoke`` and evaluated into ``eval/`` (and
prepared into ``data/``), the outputs of dvc.yaml, so ``dvc status`` listed them changed after every
night. Now it writes into ``runs/scheduled/<flow>/<UTC date-time>-<run id>/``: ``dvc status --json``
reads the same after the run as before it. Tiny random model, two benchmarks, one item each.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from helpers.repo_copy import copy_checkout
from helpers.servers import mlflow_template_db, prefect_server, run_worker_once

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))
SMALLEST = ["model.name=tiny-random", "gspo.steps=1", "gspo.questions_per_step=1", "gspo.group_size=2",
            "gspo.minibatches=1", "gspo.grad_accum=1", "gspo.checkpoint_every=1", "gspo.keep_checkpoints=1",
            "gspo.lr=1e-3", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=4", "eval.limit=1",
            "eval.benchmarks=[gsm8k,aqua]", "eval.baselines=[]", "data.benchmarks=[gsm8k,aqua]",
            "registry.min_accuracy=0"]


def _dvc_status(repo: Path, env: dict[str, str]) -> dict:
    res = subprocess.run(["dvc", "status", "--json"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(res.stdout or "{}")


def test_the_nightly_deployment_writes_a_dated_folder_and_leaves_dvc_status_as_it_was(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.states import Scheduled

    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR}")
    repo = copy_checkout(tmp_path / "repo")
    git = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "fresh clone"]):
        subprocess.run(cmd, cwd=repo, env={**os.environ, **git}, check=True, capture_output=True, timeout=120)
    cache = request.config.cache
    template = mlflow_template_db(Path(cache.mkdir("agent-gspo-mlflow")) if cache else tmp_path / "template")
    mlflow_db = tmp_path / "mlflow.db"
    mlflow_db.write_bytes(template.read_bytes())
    before = _dvc_status(repo, dict(os.environ))
    assert before, "a fresh clone without data/ and runs/ should list missing outputs"

    with prefect_server(tmp_path / "prefect") as server:
        env = {**server.client_env(), "AGENT_GSPO_HOME": str(repo), "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1",
               "AGENT_GSPO_DATA_MIRROR": str(MIRROR), "PYTHONUNBUFFERED": "1"}
        for cmd in (["work-pool", "create", "local-process", "--type", "process"],
                    ["--no-prompt", "deploy", "-n", "nightly-pipeline"]):
            out = subprocess.run([sys.executable, "-m", "prefect", *cmd], cwd=repo, env=env, capture_output=True,
                                 text=True, timeout=180)
            assert out.returncode == 0, f"{cmd}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
        with SyncPrefectClient(server.api_url) as pc:
            deployment = pc.read_deployment_by_name("agent-gspo-pipeline/nightly-pipeline")
            assert deployment.parameters["run_root"] == "runs/scheduled"
            run = pc.create_flow_run_from_deployment(
                deployment.id, parameters={"overrides": [*SMALLEST, f"tracking.uri=sqlite:///{mlflow_db}"]},
                state=Scheduled(scheduled_time=datetime.now(UTC) - timedelta(seconds=30)))
        worker = run_worker_once(env, tmp_path, "scheduled-itest", 600)
        with SyncPrefectClient(server.api_url) as pc:
            done = pc.read_flow_run(run.id)
    log = worker.stdout[-4000:] + worker.stderr[-6000:]
    assert worker.returncode == 0 and done.state_type.value == "COMPLETED", (done.state, log)

    flow_dir = repo / "runs" / "scheduled" / "agent-gspo-pipeline"
    (folder,) = list(flow_dir.iterdir())
    assert re.fullmatch(r"\d{8}T\d{6}Z-" + str(run.id), folder.name), folder.name
    assert (folder / "train" / "final").is_dir() and any((folder / "eval").iterdir())
    assert (folder / "reports" / "validation.md").is_file() and (folder / "data" / "manifest.json").is_file()
    summary = json.loads((folder / "pipeline.json").read_text())
    assert summary["promotion"]["decision"] not in ("skipped", None)  # it still went through the promotion gate
    for dvc_out in ("data", "reports", "eval", "runs/smoke", "metrics/train.json", "metrics/eval.json"):
        assert not (repo / dvc_out).exists() or dvc_out.startswith("metrics/") and (
            (repo / dvc_out).read_bytes() == (ROOT / dvc_out).read_bytes()), dvc_out
    assert _dvc_status(repo, dict(os.environ)) == before
