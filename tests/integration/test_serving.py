"""`mlflow models serve` of the champion answers as the trained multi-agent system (127.0.0.1).

The registered version is a tiny random ChatML policy with recorded settings (2 agents x 2
rounds, 4-token messages), logged exactly as training logs its final policy. The server runs
with ``--env-manager local`` in a temporary folder, resolving ``models:/<name>@champion`` from
a sqlite registry; requests go to ``/invocations`` over HTTP.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from helpers.paths import REPO_ROOT, find_under_tests
from helpers.servers import OFFLINE_ENV, free_port, mlflow_template_db, stop_group, wait_healthy
from mlflow import MlflowClient

from components.tracking import log_policy_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO_ROOT


def _helpers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_tracking_helpers", find_under_tests("test_tracking_helpers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_served_champion_answers_with_transcript_and_token_counts(tmp_path: Path, request: pytest.FixtureRequest,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    helpers = _helpers()
    cache = getattr(request.config, "cache", None)
    db = tmp_path / "mlflow.db"
    shutil.copy(mlflow_template_db(Path(cache.mkdir("agent-gspo-mlflow")) if cache else tmp_path / "tpl"), db)
    uri = f"sqlite:///{db}"
    monkeypatch.chdir(tmp_path)  # the sqlite store writes artifacts under ./mlruns
    policy = helpers.save_tiny_chat_model(tmp_path / "policy")
    mv = log_policy_model(policy, registered_name="agent-gspo-policy", tags={}, settings=helpers.system_settings(),
                          tracking_uri=uri)
    MlflowClient(uri).set_registered_model_alias("agent-gspo-policy", "champion", mv.version)

    port = free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | OFFLINE_ENV | {"MLFLOW_TRACKING_URI": uri}
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/agent-gspo-policy@champion",
           "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        wait_healthy(f"{url}/ping", proc, log, timeout_s=240)
        print(f"mlflow models serve healthy after {time.monotonic() - t0:.1f} s")

        res = requests.post(f"{url}/invocations", json={"inputs": [{"question": "What is 2 + 3?"}]}, timeout=120)
        assert res.status_code == 200, res.text
        (answer,) = res.json()["predictions"]
        assert [(m["agent"], m["round"]) for m in answer["transcript"]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
        assert {"answer", "final_text", "prompt_tokens", "completion_tokens", "communicated_tokens", "turns"} <= set(
            answer)
        assert answer["completion_tokens"] == sum(m["completion_tokens"] for m in answer["transcript"])
        assert answer["turns"] == sum(not m["silent"] for m in answer["transcript"])

        res = requests.post(f"{url}/invocations", json={
            "dataframe_records": [{"question": "Pick one", "answer_type": "choice", "choices": ["1", "2"]},
                                  {"question": "What is 1 + 1?", "choices": None}],  # a missing key is NaN to MLflow
            "params": {"agents": 3, "rounds": 1, "max_new_tokens": 2}}, timeout=120)
        assert res.status_code == 200, res.text
        assert [len(a["transcript"]) for a in res.json()["predictions"]] == [3, 3]
        assert all(m["completion_tokens"] <= 2 for a in res.json()["predictions"] for m in a["transcript"])

        # every form that carries the rows answers alike: the columnar ones were a 400 naming row 0's list
        rows = [{"question": "What is 2 + 3?", "answer_type": None, "choices": None},
                {"question": "Pick one", "answer_type": "choice", "choices": ["1", "2", "3"]}]
        questions = [{"question": "What is 2 + 3?"}, {"question": "Name a colour."}]
        for forms in (({"dataframe_records": rows}, {"inputs": {k: [r[k] for r in rows] for k in rows[0]}}),
                      ({"dataframe_records": questions}, {"instances": questions},
                       {"inputs": {"question": [q["question"] for q in questions]}})):
            answers = [requests.post(f"{url}/invocations", json=body, timeout=120) for body in forms]
            assert [a.status_code for a in answers] == [200] * len(forms), [a.text[:300] for a in answers]
            assert all(a.json() == answers[0].json() for a in answers), forms

        res = requests.post(f"{url}/invocations", json={"inputs": [{"question": "q"}], "params": {"agents": 0}},
                            timeout=60)
        assert res.status_code == 400 and "agents=0" in res.text, res.text

        # hostile requests: refused fast, naming the field, and the server stays up
        for body, named in (({"inputs": [{"question": "What is 2+3? " * 800_000}]}, "'question' is too long"),
                            ({"inputs": [{"question": None}]}, "'question' must be a non-empty string"),
                            ({"inputs": [{"question": "q"}], "params": {"max_new_tokens": 10**9}},
                             "invalid params: max_new_tokens=1000000000"),
                            ({"inputs": [{"question": "q"}], "params": {"seed": 10**20}},
                             "invalid params: seed=100000000000000000000")):
            t0 = time.monotonic()
            res = requests.post(f"{url}/invocations", json=body, timeout=60)
            assert res.status_code == 400 and named in res.text, res.text[:500]
            assert time.monotonic() - t0 < 20, f"{named}: {time.monotonic() - t0:.1f} s"
        res = requests.post(f"{url}/invocations", json={"inputs": [{"question": "What is 2 + 3?"}]}, timeout=120)
        assert res.status_code == 200, res.text
    finally:
        stop_group(proc)
