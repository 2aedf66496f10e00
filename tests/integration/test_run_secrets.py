"""`agent-gspo run --set tracking.uri=http://user:PASSWORD@...` stores the password nowhere.

Was: the data-prep subflow's copy of the config was masked, but the top-level flow run's
``overrides`` parameter held the URI with its password in Prefect's database (and the UI). The
tracking server here is not running: the run fails fast once training probes it, after the flow
run, its parameters, subflow, task runs and logs were stored. Every file under the run's
PREFECT_HOME (the temporary server's SQLite database, its WAL, logs, results), every file the run
wrote, and its output are searched for the password's bytes.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT
from helpers.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = REPO_ROOT
MIRROR = Path(os.environ.get("AGENT_GSPO_DATA_MIRROR", ROOT.parent / "shared" / "benchmarks"))
PASSWORD = "Pa55wordNeverStored42"


def _files_holding(folder: Path, needle: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_run_with_a_password_in_the_tracking_uri_stores_it_nowhere(tmp_path: Path) -> None:
    if not (MIRROR / "gsm8k").is_dir():
        pytest.skip(f"benchmark mirror not found at {MIRROR}")
    home = tmp_path / "prefect-home"
    uri = f"http://agent:{PASSWORD}@127.0.0.1:{free_port()}"  # nothing listens there
    sets = ["model.name=tiny-random", "gspo.engine=torch", "gspo.steps=1", "gspo.questions_per_step=2",
            "gspo.group_size=2", "mas.agents=2", "mas.rounds=1", "mas.max_message_tokens=4",
            "data.benchmarks=[gsm8k]", "eval.benchmarks=[gsm8k]", "eval.limit=1",
            f"data.out_dir={tmp_path / 'out' / 'data'}", f"data.report_dir={tmp_path / 'out' / 'reports'}",
            f"gspo.out_dir={tmp_path / 'out' / 'run'}", f"eval.out_dir={tmp_path / 'out' / 'eval'}",
            f"tracking.uri={uri}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "MLFLOW_TRACKING_"))}
    env.update({"PREFECT_HOME": str(home), "AGENT_GSPO_DATA_MIRROR": str(MIRROR), "OMP_NUM_THREADS": "1",
                "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
                "PYTHONUNBUFFERED": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    cmd = [sys.executable, "-m", "components.cli", "run", *[a for s in sets for a in ("--set", s)]]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]  # the tracking server is down: the run fails, as intended
    assert "unreachable" in output, output[-3000:]  # ... at training's probe, after the flow had started

    db = home / "prefect.db"
    with sqlite3.connect(db) as con:
        runs = con.execute("SELECT name, parameters FROM flow_run").fetchall()
        logs = con.execute("SELECT count(*) FROM log").fetchone()[0]
    assert len(runs) >= 2 and logs > 0, (runs, logs)  # the pipeline and its data-prep subflow, and their logs
    assert any("model.name=tiny-random" in params for _, params in runs), runs  # the overrides were stored
    assert _files_holding(home, PASSWORD.encode()) == []
    assert _files_holding(tmp_path / "out", PASSWORD.encode()) == []
    assert PASSWORD not in output
