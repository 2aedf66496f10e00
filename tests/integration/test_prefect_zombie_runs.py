"""Zombie flow runs: ``infra/prefect/zombie-runs.yaml`` marks a run Crashed once its heartbeats stop.

A real ``prefect server start`` on 127.0.0.1, the automation created from the committed file with
``prefect automation create --from-file`` (only its window shortened, to keep the test short), a
``process`` work pool, four tiny sleeping flow runs of three deployments (``prefect deploy --all``) run
by one ``prefect worker start`` that has no heartbeat setting of its own:

- *watched* and *alive*, two runs of a deployment with the nightly deployment's tags and work pool from
  the committed ``prefect.yaml`` (its job variables make the flow run's process heartbeat every 30 s):
  once *watched* has sent its second heartbeat (so the automation's wait has been re-armed by a later
  heartbeat, not only by the first), the worker's process group and *watched*'s process (Prefect
  starts it in a session of its own) are SIGKILLed, and *watched* becomes Crashed within the window
  plus a margin, with the automation's message, no earlier than a window after its last heartbeat;
  *alive*, kept alive past the window, stays Running throughout;
- *short*, deployed the same way, sends a heartbeat, completes inside the window and stays Completed
  once its last heartbeat is a window (and a margin) old;
- *unwatched*, a run without the tag and at Prefect's default 180 s heartbeat, stays Running past
  the window (the automation does not touch runs that did not opt in).

The kill does not wait for a live run to outlive the window first (the *alive* run shows that, at the
same time), so the test waits ~one window less than a kill after the window would.

Every process started here (worker, flow run processes) is killed in ``finally``; the server is
stopped by its context manager.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import yaml
from helpers.paths import REPO_ROOT
from helpers.servers import PrefectServer, prefect_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = REPO_ROOT
AUTOMATION = ROOT / "infra" / "prefect" / "zombie-runs.yaml"
PREFECT_YAML = ROOT / "prefect.yaml"
HEARTBEAT_S = 30  # what prefect.yaml's job variables set (and Prefect's minimum)
WITHIN_S = 50  # the test's window (the committed one is 120 s): one heartbeat may be 20 s late
MARGIN_S = 30  # the server's 5 s proactive step, event ingestion and our 1 s polling on 2 busy cores
SHORT_S = 15  # the short run completes inside the window, after its first heartbeat

SLEEPER = '''
import time
from prefect import flow

@flow
def sleeper(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
'''


def _prefect(server: PrefectServer, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=cwd, env=server.client_env(),
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"prefect {' '.join(args)}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out


def _test_automation(folder: Path) -> Path:
    """The committed automation with only ``trigger.within`` shortened."""
    data = yaml.safe_load(AUTOMATION.read_text())
    assert data["trigger"]["within"] == 120
    data["trigger"]["within"] = WITHIN_S
    path = folder / "zombie-runs.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _test_project(folder: Path) -> None:
    """A prefect.yaml whose watched deployments carry the committed nightly deployment's tags and pool."""
    committed = yaml.safe_load(PREFECT_YAML.read_text())
    nightly = next(d for d in committed["deployments"] if d["name"] == "nightly-pipeline")
    assert "heartbeat-30s" in nightly["tags"]
    pool = nightly["work_pool"]
    assert pool["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == str(HEARTBEAT_S)
    (folder / "sleeper.py").write_text(SLEEPER)
    deployment = {"entrypoint": "sleeper.py:sleeper"}
    project = {
        "name": "zombie-test", "prefect-version": committed["prefect-version"], "build": None, "push": None,
        "pull": [{"prefect.deployments.steps.set_working_directory": {"directory": str(folder)}}],
        "deployments": [{**deployment, "name": "watched", "tags": nightly["tags"], "work_pool": pool},
                        {**deployment, "name": "short", "tags": nightly["tags"], "work_pool": pool},
                        {**deployment, "name": "unwatched", "work_pool": {"name": pool["name"]}}]}
    (folder / "prefect.yaml").write_text(yaml.safe_dump(project, sort_keys=False))


def _heartbeats(server: PrefectServer, flow_run_id: str) -> list[datetime]:
    body = {"filter": {"event": {"name": ["prefect.flow-run.heartbeat"]},
                       "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}, "limit": 50}  # the API's maximum
    response = requests.post(f"{server.api_url}/events/filter", json=body, timeout=30)
    assert response.status_code == 200, response.text[:2000]
    events = response.json()["events"]
    return sorted(datetime.fromisoformat(e["occurred"]) for e in events)


def _wait(what: str, check: Callable[[], Any], timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if value := check():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout_s:.0f} s; worker log:\n"
                                 f"{log.read_text(errors='replace')[-4000:] if log.exists() else '(none)'}")
        time.sleep(1)


def _flow_run_pids(root_pid: int, flow_run_ids: set[str]) -> dict[str, int]:
    """The processes under ``root_pid`` that run one of ``flow_run_ids`` (from their environment)."""
    found: dict[str, int] = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(root_pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                run_id = child.environ().get("PREFECT__FLOW_RUN_ID")
                if run_id in flow_run_ids:
                    found[run_id] = child.pid
    return found


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(pid), signal.SIGKILL)


def _kill_everything_started_for(server: PrefectServer, worker: subprocess.Popen | None) -> None:
    """The worker's group, and every process still talking to this test's server (the flow runs that
    outlived their worker, each in its own session); waits until they are gone."""
    victims: list[psutil.Process] = []
    if worker is not None:
        with contextlib.suppress(psutil.NoSuchProcess):
            victims += psutil.Process(worker.pid).children(recursive=True)
        _kill_group(worker.pid)
        worker.wait(30)
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if proc.pid != os.getpid() and proc.environ().get("PREFECT_API_URL") == server.api_url:
                victims.append(proc)
    for proc in victims:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.kill()
    _, alive = psutil.wait_procs(victims, timeout=30)
    assert not alive, f"still running after SIGKILL: {alive}"


def test_killed_flow_run_is_marked_crashed_and_live_ones_are_not(tmp_path: Path) -> None:
    from prefect.client.orchestration import SyncPrefectClient

    project = tmp_path / "project"
    project.mkdir()
    _test_project(project)
    automation = _test_automation(tmp_path)
    worker_log = tmp_path / "worker.log"
    t_start = time.monotonic()
    with prefect_server(tmp_path) as server:
        worker: subprocess.Popen | None = None
        try:
            created = _prefect(server, tmp_path, "automation", "create", "--from-file", str(automation))
            assert "Created automation 'agent-gspo-crash-zombie-flow-runs'" in created.stdout, created.stdout
            _prefect(server, project, "work-pool", "create", "local-process", "--type", "process")
            _prefect(server, project, "--no-prompt", "deploy", "--all")
            with SyncPrefectClient(server.api_url) as client:
                deployments = {"watched": "watched", "alive": "watched", "short": "short", "unwatched": "unwatched"}
                runs = {name: str(client.create_flow_run_from_deployment(
                    client.read_deployment_by_name(f"sleeper/{deployment}").id,
                    parameters={"seconds": SHORT_S if name == "short" else 600}).id)
                        for name, deployment in deployments.items()}

            def states() -> dict[str, str]:
                with SyncPrefectClient(server.api_url) as client:
                    return {name: client.read_flow_run(run_id).state_type.value for name, run_id in runs.items()}

            env = {k: v for k, v in server.client_env().items()
                   if k not in ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")}
            with worker_log.open("w") as log:  # the heartbeat setting comes from the deployments' job variables
                worker = subprocess.Popen(
                    [sys.executable, "-m", "prefect", "worker", "start", "--pool", "local-process", "--name",
                     "zombie-worker", "--install-policy", "never"], cwd=tmp_path, stdout=log,
                    stderr=subprocess.STDOUT, env=env | {"PREFECT_WORKER_QUERY_SECONDS": "2"},
                    start_new_session=True)
            long_runs = {runs[name] for name in ("watched", "alive", "unwatched")}
            _wait("all Running (the short one Running or Completed) with a heartbeat", lambda: all(
                s == "RUNNING" or name == "short" and s == "COMPLETED" for name, s in states().items()) and all(
                _heartbeats(server, run_id) for run_id in runs.values()), 180, worker_log)
            t0 = time.monotonic()
            pids = _flow_run_pids(worker.pid, long_runs)
            assert set(pids) == long_runs, pids
            assert all(os.getsid(pid) != os.getsid(worker.pid) for pid in pids.values())  # not in the worker's group

            # The machine "dies" once the watched run has heartbeat twice (and the short one, as before, has
            # completed): the worker's process group and the watched run's process (the alive one, in a
            # session of its own, lives on).
            _wait("a second heartbeat of the watched run, the short one Completed",
                  lambda: len(_heartbeats(server, runs["watched"])) >= 2 and states()["short"] == "COMPLETED",
                  HEARTBEAT_S + 30, worker_log)
            watched = psutil.Process(pids[runs["watched"]])
            _kill_group(worker.pid)
            _kill_group(watched.pid)
            t_kill = time.monotonic()
            worker.wait(30)
            _, left = psutil.wait_procs([watched], timeout=30)
            assert not left, left
            last_beat = _heartbeats(server, runs["watched"])[-1]

            # Alive past the window: a live run is not touched, the short one completed and stays so.
            time.sleep(max(0.0, t0 + WITHIN_S + 15 - time.monotonic()))
            now = states()
            assert {name: now[name] for name in ("alive", "short", "unwatched")} == {
                "alive": "RUNNING", "short": "COMPLETED", "unwatched": "RUNNING"}, now
            beats = _heartbeats(server, runs["alive"])
            gaps = [(b - a).total_seconds() for a, b in zip(beats, beats[1:], strict=False)]
            assert len(beats) >= 2 and all(g < HEARTBEAT_S + 10 for g in gaps), beats  # 30 s, from job variables
            assert len(_heartbeats(server, runs["unwatched"])) == 1  # Prefect's default: every 180 s

            _wait("watched run Crashed", lambda: states()["watched"] == "CRASHED",
                  max(1.0, t_kill + WITHIN_S + MARGIN_S - time.monotonic()), worker_log)
            kill_to_crashed = time.monotonic() - t_kill
            with SyncPrefectClient(server.api_url) as client:
                crashed = client.read_flow_run(runs["watched"]).state
            print(f"kill -> Crashed {kill_to_crashed:.1f} s; last heartbeat -> Crashed "
                  f"{(crashed.timestamp - last_beat).total_seconds():.1f} s (window {WITHIN_S} s)")
            assert "stopped sending heartbeats" in (crashed.message or ""), crashed
            assert (crashed.timestamp - last_beat).total_seconds() >= WITHIN_S - 1  # not before the window ran out

            # Once the short run's last heartbeat is a window (and a margin) old, it is still Completed; the
            # unwatched one, whose one heartbeat is older still, is still Running: neither was touched; the
            # alive one, heartbeating all along, is still Running.
            with SyncPrefectClient(server.api_url) as client:
                completed_at = client.read_flow_run(runs["short"]).state.timestamp
            time.sleep(max(0.0, (completed_at - datetime.now(UTC)).total_seconds() + WITHIN_S + 10))
            assert states() == {"watched": "CRASHED", "alive": "RUNNING", "short": "COMPLETED", "unwatched": "RUNNING"}
        finally:
            _kill_everything_started_for(server, worker)
    print(f"test body {time.monotonic() - t_start:.0f} s")
