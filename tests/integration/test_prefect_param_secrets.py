"""A password in a flow's parameters never reaches Prefect's database, however the run is created.

On a real ``prefect server start`` (127.0.0.1, its own SQLite database): ``prefect deploy -n
evaluate`` from prefect.yaml as the README says, then flow runs created from that deployment
through the API (what ``prefect deployment run --param``, the UI and automations do) with
``tracking.uri=http://user:PASSWORD@...`` in ``overrides``, a ``search.storage`` password, a
token query parameter, and a password in ``model``; then a direct Python call of
``evaluate_flow`` with the same overrides. Each is refused (the server answers 409 naming the
fix; the direct call fails validation naming the environment variables), a clean run is still
created, and every file under the server's PREFECT_HOME (database, WAL, logs) is searched for the
password's bytes.

Was (on a0d6166): the server stored each of those runs with the password in plain text.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from helpers.servers import prefect_server

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT
PASSWORD = "Pa55wordNeverStored77"

CLIENT = r"""
import json, sys
from prefect.client.orchestration import get_client
from flows.pipeline import evaluate_flow

password, run_root = sys.argv[1], sys.argv[2]
bad = {
    "tracking-uri": {"overrides": [f"tracking.uri=http://agent:{password}@127.0.0.1:5000"]},
    "storage": {"overrides": [f"search.storage=postgresql+psycopg://optuna:{password}@db/optuna"]},
    "token": {"overrides": [f"tracking.uri=https://mlflow.example/?token={password}"]},
    "model": {"model": f"https://agent:{password}@hub.example/model"},
}
out = {"refused": {}, "created": {}}
with get_client(sync_client=True) as pc:
    deployment = pc.read_deployment_by_name("agent-gspo-evaluate/evaluate")
    out["schema_has_pattern"] = "no password or token" in json.dumps(deployment.parameter_openapi_schema)
    for name, params in bad.items():
        try:
            run = pc.create_flow_run_from_deployment(deployment.id, parameters=params)
            out["created"][name] = str(run.id)
        except Exception as exc:
            out["refused"][name] = f"{type(exc).__name__}: {exc}"
    clean = pc.create_flow_run_from_deployment(deployment.id, parameters={"overrides": ["eval.limit=1"]})
    out["clean"] = clean.parameters
try:
    evaluate_flow(overrides=bad["tracking-uri"]["overrides"], run_root=run_root)
    out["direct"] = "ran"
except Exception as exc:
    out["direct"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _files_holding(folder: Path, needle: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_deployment_runs_and_direct_calls_with_a_password_store_nothing(tmp_path: Path) -> None:
    with prefect_server(tmp_path) as server:
        env = {**server.client_env(), "AGENT_GSPO_HOME": str(ROOT), "PYTHONPATH": str(ROOT)}

        def run(*args: str) -> subprocess.CompletedProcess:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            return proc

        run("-m", "prefect", "work-pool", "create", "local-process", "--type", "process")
        run("-m", "prefect", "--no-prompt", "deploy", "-n", "evaluate")
        proc = run("-c", CLIENT, PASSWORD, str(tmp_path / "runs"))
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        home = server.home
        assert out["schema_has_pattern"], out
        assert out["created"] == {}, f"runs holding a password were created: {out}"
        assert set(out["refused"]) == {"tracking-uri", "storage", "token", "model"}, out
        for why in out["refused"].values():
            assert "409" in why and "MLFLOW_TRACKING_PASSWORD" in why, why
        assert out["clean"]["overrides"] == ["eval.limit=1"], out  # with the deployment's defaults
        print(json.dumps(out, indent=1))
        assert "MLFLOW_TRACKING_PASSWORD" in out["direct"] and PASSWORD not in out["direct"], out
    # the server is stopped: its database and WAL are complete on disk
    assert (home / "prefect.db").is_file()
    assert _files_holding(home, PASSWORD.encode()) == []
    if (tmp_path / "runs").exists():
        assert _files_holding(tmp_path / "runs", PASSWORD.encode()) == []
