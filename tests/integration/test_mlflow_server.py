"""Real ``mlflow server`` on 127.0.0.1: log, register, promote, resolve; then a dead server.

The server runs with a sqlite backend and proxied artifact storage (``--serve-artifacts
--artifacts-destination``), so the client reaches artifacts only over HTTP, like a production
client talking to a remote server. MLflow 3.17 flags used: ``--backend-store-uri``,
``--artifacts-destination``, ``--serve-artifacts``, ``--host``, ``--port``, ``--workers``; the
default ``--allowed-hosts`` (localhost + private IPs) already admits 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from helpers.paths import find_under_tests
from helpers.servers import OFFLINE_ENV
from mlflow import MlflowClient

from components.comparison import ComparisonRule
from components.tracking import GateRule, GateSpec, Tracker, TrackingError, promote, resolve_model_uri
from components.tracking.signing import KEY_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RULE = GateRule(ComparisonRule(min_items=20), min_accuracy=0.1)


def _unit_helper(name: str):
    spec = importlib.util.spec_from_file_location(name, find_under_tests(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helpers = _unit_helper("test_tracking_helpers")
gate_helpers = _unit_helper("gate_helpers")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server's process group (uvicorn workers included) that this test started."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


@pytest.fixture()
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, subprocess.Popen]]:
    db = tmp_path / "server.db"  # copy a migrated DB: saves the 5-10 s schema migration
    shutil.copy(helpers.template_db(Path(request.config.cache.mkdir("agent-gspo-mlflow"))), db)
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
           "--artifacts-destination", str(tmp_path / "artifacts"), "--serve-artifacts",
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {**os.environ, **OFFLINE_ENV}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited {proc.returncode}: {(tmp_path / 'server.log').read_text()}")
            try:
                if requests.get(f"{uri}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not healthy after 120 s: {(tmp_path / 'server.log').read_text()}")
            time.sleep(0.25)
        yield uri, proc
    finally:
        _stop(proc)
        log.close()


def test_log_register_promote_resolve_then_dead_server(server, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    uri, proc = server
    for key, value in {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                       "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
                       KEY_ENV: secrets.token_hex(32)}.items():  # a team's shared key (not the user's own file)
        monkeypatch.setenv(key, value)
    model_dir = helpers.build_tiny_hf_model(tmp_path / "tiny")
    settings = helpers.system_settings()
    with Tracker(uri, "agent-gspo", "train", {"stage": "train"}) as tracker:
        tracker.log_params({"gspo": {"lr": 1e-6, "steps": 2}})
        tracker.log_metrics({"train/reward": 0.5, "train/tokens_total": 321}, step=1)
        v1, v2, v3 = (tracker.log_policy_model(model_dir, registered_name="policy", tags={"config.sha256": f"c{k}"},
                                               settings=settings) for k in (1, 2, 3))
        run_id = tracker.run_id
    client = MlflowClient(uri)
    v1, v2, v3 = str(v1.version), str(v2.version), str(v3.version)
    for version, right, tokens in ((v1, 30, 100), (v2, 54, 100), (v3, 54, 30)):  # v3: v2's answers, cheaper
        gate_helpers.evaluate(client, tmp_path, "policy", version,
                              gate_helpers.records([i < right for i in range(60)], tokens), key="s1")

    gate = {"gate": GateSpec("s1", RULE, trust=gate_helpers.trust(client))}
    assert promote(client, "policy", v1, **gate).decision == "champion"
    results: list = []
    def worker(version: str) -> None:  # auto lock over HTTP = the registered-model tag lease
        results.append(promote(MlflowClient(uri), "policy", version, **gate))

    threads = [threading.Thread(target=worker, args=(v,)) for v in (v2, v3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    first, second = sorted(results, key=lambda d: d.compared_to != v1)
    assert first.compared_to == v1 and second.compared_to == first.version  # serialised

    run = client.get_run(run_id)
    assert run.data.metrics["train/tokens_total"] == 321 and run.data.params["gspo.lr"] == "1e-06"
    model = client.get_registered_model("policy")
    assert str(model.aliases["champion"]) == v3 and "promotion.lock" not in model.tags
    assert client.get_model_version("policy", v3).tags["config.sha256"] == "c3"

    folder = resolve_model_uri("models:/policy@champion", dst_dir=tmp_path / "cache", tracking_uri=uri)
    assert f"/policy/{v3}-" in str(folder)
    AutoModelForCausalLM.from_pretrained(folder)

    open_run = Tracker(uri, "agent-gspo", "after").__enter__()
    _stop(proc)
    start = time.monotonic()
    with pytest.raises(TrackingError, match=uri.replace(".", r"\.")):
        open_run.log_metrics({"train/reward": 1.0}, step=2)
    assert time.monotonic() - start < 30
    open_run.__exit__(None, None, None)  # must not raise or hang on a dead server
    start = time.monotonic()
    with pytest.raises(TrackingError, match="unreachable"):
        with Tracker(uri, "agent-gspo", "never"):
            pass
    assert time.monotonic() - start < 10


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")
def test_test_servers_leave_nothing_in_dev_shm(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """MLflow 3.x's server puts its job queue in a ``/dev/shm/tmp*`` folder it never removes; the
    test servers run without job execution, so a start / stop leaves no folder behind."""
    from helpers.servers import mlflow_server

    before = set(os.listdir("/dev/shm"))
    with mlflow_server(tmp_path, Path(request.config.cache.mkdir("agent-gspo-mlflow"))) as srv:
        assert requests.get(f"{srv.url}/health", timeout=5).status_code == 200
    leaked = [name for name in set(os.listdir("/dev/shm")) - before if name.startswith("tmp")]
    assert not leaked, f"mlflow server left {leaked} in /dev/shm"
