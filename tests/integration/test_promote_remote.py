"""``agent-gspo promote`` against a remote ``mlflow server`` acts as on SQLite and leaves no stray file.

Was: reading the candidate's recorded serving settings went through a ``models:/`` URI, which MLflow
resolves on its *global* registry URI whatever registry is passed; in a fresh process that is the
default ``sqlite:///mlflow.db``. Against an HTTP registry the version was then "not found" there
(so no protocol-mismatch warning) and an empty ``mlflow.db`` was left in the working folder.
The command runs as a user runs it: a new process, in an empty folder.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from helpers import gate_helpers
from helpers.paths import REPO_ROOT, find_under_tests
from helpers.servers import mlflow_server, mlflow_template_db

from components.config import load_config
from components.evaluation.setting import planned_setting
from components.tracking.policy_model import log_policy_model
from components.tracking.signing import KEY_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO_ROOT
NAME = "agent-gspo-policy"
_spec = importlib.util.spec_from_file_location(
    "test_tracking_helpers", find_under_tests("test_tracking_helpers.py"))
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)


@pytest.fixture(params=["sqlite", "http"])
def registry(request: pytest.FixtureRequest, tmp_path: Path):
    cache = Path(request.config.cache.mkdir("agent-gspo-mlflow"))
    if request.param == "sqlite":
        db = tmp_path / "registry" / "mlflow.db"
        db.parent.mkdir()
        shutil.copy(mlflow_template_db(cache), db)
        yield f"sqlite:///{db}", tmp_path / "registry" / "artifacts"
        return
    with mlflow_server(tmp_path, cache) as server:
        yield server.url, None


def test_promote_warns_about_the_served_protocol_and_writes_nothing_in_the_working_folder(
        registry: tuple[str, Path | None], prepared_data: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    uri, artifacts = registry
    if artifacts is None:  # a server: the team's key in the environment (sqlite: generated beside the database)
        monkeypatch.setenv(KEY_ENV, secrets.token_hex(32))
    sets = ["model.name=tiny-random", "mas.agents=2", "mas.rounds=2", "eval.limit=1", "eval.benchmarks=[gsm8k]",
            "registry.min_accuracy=0", "registry.gate.min_items=2", f"tracking.uri={uri}",
            f"data.out_dir={prepared_data}"]
    cfg = load_config(ROOT / "params.yaml", None, sets)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("promote-remote", artifact_location=str(artifacts) if artifacts else None)
    with mlflow.start_run(experiment_id=exp):
        version = str(log_policy_model(helpers.build_tiny_hf_model(tmp_path / "policy"), registered_name=NAME,
                                       tags={}, tracking_uri=uri,
                                       settings=helpers.system_settings("mas.agents=3", "mas.rounds=2")).version)
    setting = planned_setting(cfg)  # an evaluation with its per-item record under the gate's setting
    gate_helpers.evaluate(mlflow.MlflowClient(uri), tmp_path, NAME, version,
                          gate_helpers.records([True, False], 100.0), key=setting.key())

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env = {k: v for k, v in env.items() if k != "MLFLOW_REGISTRY_URI"} | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "components.cli", "promote", "--params", str(ROOT / "params.yaml"),
           *[a for s in sets for a in ("--set", s)]]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{NAME} v{version} under setting" in proc.stdout and "decision: champion" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "records another protocol for serving" in line]
    assert len(warnings) == 1 and "agents 2->3" in warnings[0], proc.stderr[-3000:]
    assert sorted(p.name for p in cwd.iterdir()) == []
