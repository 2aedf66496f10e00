"""Tracker, metric vocabulary and params flattening against a sqlite:/// store in tmp_path."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from helpers.paths import load_test_module
from matplotlib.figure import Figure
from mlflow import MlflowClient

from components.config import Config
from components.tracking import (
    METRIC_NAMES,
    Tracker,
    TrackingError,
    flatten_params,
    git_commit,
    is_metric_name,
    validate_metrics,
)
from components.tracking.backend import HTTP_RETRY_DEFAULTS, check_reachable, configure_http_retries

test_tracking_helpers = load_test_module("test_tracking_helpers")

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixture


def test_sqlite_parent_folder_is_created(tmp_path: Path) -> None:
    db = tmp_path / "new" / "sub" / "mlflow.db"
    check_reachable(f"sqlite:///{db}")
    assert db.parent.is_dir()


def test_metric_vocabulary_accepts_design_names_and_eval_pattern() -> None:
    assert len(METRIC_NAMES) == 17
    for name in ("train/reward", "gspo/approx_kl", "perf/step_s", "eval/gsm8k/accuracy", "silence/agent2_round1",
                 "train/budget_tokens",
                 "eval/math500/tokens_per_correct", "eval/mmlu/silence_rate", "eval/humaneval/tokens_total"):
        assert is_metric_name(name), name
    for name in ("train/acc", "train/Reward", "eval/gsm8k/acc", "eval//accuracy", "eval/GSM8K/accuracy",
                 "gspo/kl", "reward", "eval/gsm8k/accuracy/x"):
        assert not is_metric_name(name), name


def test_validate_metrics_rejects_unknown_names_and_non_numbers() -> None:
    with pytest.raises(ValueError, match=r"train/acc.*allowed"):
        validate_metrics({"train/acc": 0.5, "train/reward": 1.0})
    with pytest.raises(ValueError, match="not a number"):
        validate_metrics({"train/reward": "high"})
    with pytest.raises(ValueError, match="not a number"):
        validate_metrics({"train/reward": True})
    assert validate_metrics({"train/turns": 3, "eval/svamp/accuracy": 0.25}) == {
        "train/turns": 3.0, "eval/svamp/accuracy": 0.25}


def test_flatten_params_nests_stringifies_and_truncates() -> None:
    flat = flatten_params({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": None, "f": 0.1, "g": {}, "h": True,
                           "long": "x" * 7000})
    assert flat["a.b.c"] == "1" and flat["a.d"] == "[1, 2]" and flat["e"] == "None"
    assert flat["f"] == "0.1" and flat["g"] == "{}" and flat["h"] == "True"
    assert len(flat["long"]) == 6000 and flat["long"].endswith("...")
    cfg = flatten_params(Config())
    assert cfg["gspo.eps_low"] == "0.0003" and cfg["registry.model_name"] == "agent-gspo-policy"
    assert set(cfg) >= {k for k in Config().flat() if not isinstance(Config().flat()[k], dict)}


def test_tracker_logs_params_metrics_tags_artifacts(mlflow_uri: str, tmp_path: Path) -> None:
    uri = mlflow_uri
    params = {"group": {f"p{i:03d}": i for i in range(250)}, "blob": "y" * 9000}  # > 2 chunks of 100
    artifact = tmp_path / "report.json"
    artifact.write_text('{"ok": true}')
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    fig = Figure()  # no pyplot: no global figure state, no display backend
    fig.add_subplot().plot([0, 1], [1, 0])
    with Tracker(uri, "exp", "train", {"stage": "train"}) as tracker:
        tracker.log_params(params)
        for step in range(3):
            tracker.log_metrics({"train/reward": 0.1 * step, "eval/gsm8k/accuracy": 0.5}, step=step)
        tracker.set_tags({"config.sha256": "abc"})
        tracker.log_artifact(artifact)
        tracker.log_artifact(folder, artifact_path="extra")
        tracker.log_figure(fig, "plots/curve.png")
        with pytest.raises(ValueError, match="train/acc"):
            tracker.log_metrics({"train/acc": 1.0}, step=0)
        run_id = tracker.run_id
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "train"
    assert len(run.data.params) == 251 and run.data.params["group.p249"] == "249"
    assert len(run.data.params["blob"]) == 6000
    assert run.data.tags["stage"] == "train" and run.data.tags["config.sha256"] == "abc"
    history = client.get_metric_history(run_id, "train/reward")
    assert [m.step for m in history] == [0, 1, 2] and history[-1].value == pytest.approx(0.2)
    assert "train/acc" not in run.data.metrics
    paths = {a.path for folder in ("", "plots") for a in client.list_artifacts(run_id, folder or None)}
    assert {"report.json", "extra", "plots/curve.png"} <= paths


def test_tracker_from_config_tags_hash_and_profile(mlflow_uri: str) -> None:
    cfg = Config()
    cfg.tracking.uri = mlflow_uri
    with Tracker.from_config(cfg, "cfg", {"stage": "x"}) as tracker:
        tracker.log_params(cfg)
        run_id = tracker.run_id
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.data.tags["config.sha256"] == cfg.hash() and run.data.tags["config.profile"] == "default"
    assert run.data.tags["stage"] == "x" and run.data.params["mas.agents"] == "3"
    assert run.info.experiment_id == MlflowClient(mlflow_uri).get_experiment_by_name("agent-gspo").experiment_id


def test_tracker_marks_failed_run_and_supports_nesting(mlflow_uri: str) -> None:
    uri = mlflow_uri
    with pytest.raises(RuntimeError):
        with Tracker(uri, "exp", "outer") as outer:
            with outer.child("inner", {"kind": "eval"}) as inner:
                inner.log_metrics({"eval/aqua/accuracy": 0.3})
                inner_id = inner.run_id
            raise RuntimeError("boom")
    client = MlflowClient(uri)
    assert client.get_run(outer.run_id).info.status == "FAILED"
    inner_run = client.get_run(inner_id)
    assert inner_run.info.status == "FINISHED"
    assert inner_run.data.tags["mlflow.parentRunId"] == outer.run_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_fails_fast_naming_the_uri() -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(TrackingError, match=dead.replace(".", r"\.")) as info:
        with Tracker(dead, "exp", "r"):
            pass
    assert time.monotonic() - start < 5
    assert info.value.exit_code == 2


def test_http_retry_defaults_are_bounded_and_user_values_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in HTTP_RETRY_DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    configure_http_retries()
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT
    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 3
    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == 7


def test_git_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_GSPO_GIT_COMMIT", raising=False)
    assert git_commit(tmp_path) is None  # not a repository
    sha = git_commit(Path(__file__).parent)
    assert sha is None or len(sha) == 40
    monkeypatch.setenv("AGENT_GSPO_GIT_COMMIT", "deadbeef")
    assert git_commit(tmp_path) == "deadbeef"


@pytest.mark.slow
def test_a_locked_database_at_the_end_of_a_run_is_one_warning_not_a_traceback(tmp_path: Path, capfd) -> None:
    """Another process holds the sqlite file when the run ends (~20 s: MLflow's busy timeout). Was:
    MLflow's ~60-line SQLAlchemy traceback, then silence (the run left RUNNING without a word)."""
    import sqlite3

    db = tmp_path / "m.db"
    with pytest.raises(ZeroDivisionError):  # the block's own error still propagates, unmasked
        with Tracker(f"sqlite:///{db}", "exp", "locked") as tracker:
            holder = sqlite3.connect(db, timeout=0)
            holder.execute("BEGIN EXCLUSIVE")
            1 / 0  # noqa: B018
    err = capfd.readouterr().err
    holder.rollback()
    holder.close()
    assert "Traceback" not in err and "SQLAlchemy database error" not in err, err[-3000:]
    assert f"warning: MLflow run {tracker.run_id} could not be marked FAILED" in err and "database is locked" in err
    assert MlflowClient(f"sqlite:///{db}").get_run(tracker.run_id).info.status == "RUNNING"  # as the warning says
