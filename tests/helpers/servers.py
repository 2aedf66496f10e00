"""Real MLflow and Prefect servers on 127.0.0.1 for integration tests.

Both context managers start the server as a child process in its own session (so its process
group, uvicorn workers included, can be stopped as one), poll ``/health`` with a bounded
deadline, yield the URL, and always stop the group in ``finally``. Everything a server writes
(sqlite databases, artifacts, PREFECT_HOME, logs) lives under the given tmp folder.

Why subprocesses rather than Prefect's ``prefect_test_harness`` / an ephemeral API: the tests
must exercise the same HTTP clients, retries and worker processes a deployment uses.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from helpers.paths import find_under_tests

# MLFLOW_SERVER_ENABLE_JOB_EXECUTION: MLflow 3.x's server otherwise starts a huey job consumer
# (GenAI evaluation jobs, unused here) whose queue lives in a fresh ``/dev/shm/tmp*`` folder that
# it never removes: one leaked folder per server start, and one more process per test server.
OFFLINE_ENV = {"DO_NOT_TRACK": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class ServerError(RuntimeError):
    """A server did not become healthy in time (the message carries the tail of its log)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group this module started (``start_new_session``), SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace_s)
    except ProcessLookupError:
        pass


def group_gone(pgid: int) -> bool:
    """Whether no process of group ``pgid`` is left (zombies awaiting their parent's wait count as left)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; raise :class:`ServerError` when the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise ServerError(f"server exited {proc.returncode} before {url} was healthy:\n{_tail(log)}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"{url} not healthy after {timeout_s:.0f} s:\n{_tail(log)}")
        time.sleep(0.3)


def mlflow_template_db(cache_dir: Path) -> Path:
    """A migrated, empty MLflow sqlite database, built once per MLflow version and then copied.

    The recipe lives in ``tests/unit/test_tracking_helpers.template_db`` (loaded by path: test files
    are not a package), so both suites share one cached copy.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "test_tracking_helpers", find_under_tests("test_tracking_helpers.py"))
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    return helpers.template_db(cache_dir)


@dataclass
class MlflowServer:
    """A running ``mlflow server``: its URL, and what :meth:`restart` needs to bring it back."""

    url: str
    port: int
    db: Path
    artifacts: Path
    log: Path
    proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.db}",
               "--artifacts-destination", str(self.artifacts), "--serve-artifacts",
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.db.parent,
                                         env={**os.environ, **OFFLINE_ENV}, start_new_session=True)
        try:
            wait_healthy(f"{self.url}/health", self.proc, self.log, timeout_s)
        except ServerError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)

    def restart(self, timeout_s: float = 120.0) -> None:
        """Stop (if running) and start again on the same port, database and artifact folder."""
        self.stop()
        self.start(timeout_s)


@contextmanager
def mlflow_server(tmp_path: Path, cache_dir: Path | None = None, timeout_s: float = 120.0) -> Iterator[MlflowServer]:
    """``mlflow server`` with a sqlite backend and proxied local artifacts; yields the handle (``.url``).

    ``cache_dir`` holds the migrated template DB (pass pytest's cache dir to reuse it across runs).
    """
    folder = tmp_path / "mlflow-server"
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "mlflow.db"
    shutil.copy(mlflow_template_db(cache_dir or folder / "template"), db)
    port = free_port()
    server = MlflowServer(f"http://127.0.0.1:{port}", port, db, folder / "artifacts", folder / "server.log")
    try:
        server.start(timeout_s)
        yield server
    finally:
        server.stop()


@dataclass
class PrefectServer:
    """A running ``prefect server start``: its API URL and the env a client process needs."""

    api_url: str
    home: Path
    log: Path
    proc: subprocess.Popen

    def client_env(self) -> dict[str, str]:
        """Environment for a flow / worker / CLI process talking to this server."""
        return {**os.environ, **OFFLINE_ENV, "PREFECT_API_URL": self.api_url, "PREFECT_HOME": str(self.home),
                "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false"}


@contextmanager
def prefect_server(tmp_path: Path, timeout_s: float = 150.0) -> Iterator[PrefectServer]:
    """``prefect server start`` on a free port with PREFECT_HOME and a sqlite DB in ``tmp_path``."""
    home = tmp_path / "prefect-home"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = tmp_path / "prefect-server.log"
    env = {**os.environ, **OFFLINE_ENV, "PREFECT_HOME": str(home),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
           "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
           "PREFECT_SERVER_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
           "--no-ui", "--analytics-off"]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=home, env=env,
                                start_new_session=True)
    try:
        wait_healthy(f"{api_url}/health", proc, log, timeout_s)
        yield PrefectServer(api_url, home, log, proc)
    finally:
        stop_group(proc)


def run_worker_once(env: dict[str, str], cwd: Path, name: str, timeout_s: float) -> subprocess.CompletedProcess:
    """``prefect worker start --pool local-process --run-once``: picks up the due flow runs, runs them, exits."""
    t0 = time.monotonic()
    worker = subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", "local-process",
                             "--name", name, "--run-once", "--install-policy", "never"],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    print(f"worker --run-once ({name}): {time.monotonic() - t0:.1f} s")
    return worker
