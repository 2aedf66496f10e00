"""A database-backed registry that fails: one line naming the redacted URI, exit 2, within seconds.

MLflow raises SQLAlchemy's errors (and a missing driver's ImportError) unwrapped while it creates
its store, and retries an engine that does not connect 10 times (~100 s) unless bounded.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import time
from pathlib import Path

import mlflow.store.db.utils as db_utils
import pytest
from helpers.paths import REPO_ROOT, load_test_module

from components.tracking import Tracker, TrackingError
from components.tracking.backend import DB_ATTEMPTS_ENV, configure_http_retries, guarded
from components.tracking.versions import registry_client

test_tracking_helpers = load_test_module("test_tracking_helpers")

ROOT = REPO_ROOT


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


@pytest.fixture()
def locked_db(tmp_path: Path, request: pytest.FixtureRequest):
    """A migrated MLflow database another connection holds an exclusive lock on."""
    import shutil

    db = tmp_path / "locked.db"
    shutil.copy(test_tracking_helpers.template_db(Path(request.config.cache.mkdir("agent-gspo-mlflow"))), db)
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN EXCLUSIVE")
    yield db
    conn.execute("ROLLBACK")
    conn.close()


def test_a_locked_sqlite_registry_is_one_line_naming_the_uri(locked_db: Path) -> None:
    uri = f"sqlite:///{locked_db}"
    start = time.monotonic()
    with pytest.raises(TrackingError) as err:
        registry_client(uri)
    assert time.monotonic() - start < 60
    text = _one_line(err.value)
    assert f"MLflow tracking URI {uri}" in text and "database is locked" in text and "write lock" in text


def test_a_malformed_sqlite_uri_is_one_line_with_the_right_forms(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrackingError) as err:
        registry_client("sqlite://mlflow.db")
    text = _one_line(err.value)
    assert "sqlite://mlflow.db" in text and "Invalid SQLite URL" in text and "sqlite:////absolute/path.db" in text
    with pytest.raises(TrackingError, match="open the tracking store failed on MLflow tracking URI sqlite://mlflow"):
        with Tracker("sqlite://mlflow.db", "exp"):  # training and evaluation open their run the same way
            pass


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None, reason="the MySQL driver is installed here")
def test_a_missing_database_driver_is_one_line_without_the_password() -> None:
    with pytest.raises(TrackingError) as err:
        registry_client("mysql://u:MyS3cret@127.0.0.1:1/x")
    text = _one_line(err.value)
    assert "MyS3cret" not in text and "mysql://u:***@127.0.0.1:1/x" in text
    assert "No module named 'MySQLdb'" in text and "driver is not installed" in text


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "sqlite:///mlflow.db"])
def test_an_import_error_not_raised_by_sqlalchemy_stays_a_bug(uri: str) -> None:
    """Only SQLAlchemy loading a driver means "not installed"; any other ImportError keeps its traceback."""
    def broken() -> None:
        raise ImportError("a bug in our own code")

    with pytest.raises(ImportError, match="a bug in our own code"):
        guarded(uri, "log", broken)


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is None,
                    reason="no Postgres driver installed")
def test_an_unreachable_postgres_fails_within_seconds(monkeypatch: pytest.MonkeyPatch,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(DB_ATTEMPTS_ENV, raising=False)  # the project's default (3 attempts)
    monkeypatch.setattr(db_utils, "MAX_RETRY_COUNT", db_utils.MAX_RETRY_COUNT)  # restored after the test
    start = time.monotonic()
    with pytest.raises(TrackingError) as err:
        registry_client("postgresql://bob:PgS3cret@127.0.0.1:1/mlflow")
    elapsed = time.monotonic() - start
    text = _one_line(err.value)
    assert elapsed < 20, f"{elapsed:.0f} s: MLflow's engine retries are not bounded"
    assert "PgS3cret" not in text and "postgresql://bob:***@127.0.0.1:1/mlflow" in text
    assert "OperationalError" in text
    assert "will be retried" not in capfd.readouterr().err  # MLflow's multi-line retry warnings are quiet


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is None, reason="no Postgres driver installed")
def test_a_postgres_that_accepts_and_never_answers_fails_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: psycopg waits for the server's first byte without a limit, so a stopped Postgres (or a proxy
    whose backend is gone) hung the command forever. The project's PGCONNECT_TIMEOUT (10 s) bounds
    each attempt."""
    import socket
    import threading

    from components.env import TRACKING_DEFAULTS

    assert TRACKING_DEFAULTS["PGCONNECT_TIMEOUT"] == "10" and os.environ["PGCONNECT_TIMEOUT"] == "10"
    monkeypatch.setenv(DB_ATTEMPTS_ENV, "1")  # one attempt keeps the test at ~10 s
    monkeypatch.setattr(db_utils, "MAX_RETRY_COUNT", db_utils.MAX_RETRY_COUNT)  # restored after the test
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    port = silent.getsockname()[1]
    start = time.monotonic()
    try:
        with pytest.raises(TrackingError) as err:
            registry_client(f"postgresql+psycopg://bob:PgS3cret@127.0.0.1:{port}/mlflow")
    finally:
        silent.close()
        for conn in accepted:
            conn.close()
    elapsed = time.monotonic() - start
    text = _one_line(err.value)
    assert accepted, "the client never connected"
    assert 9 <= elapsed < 25, f"{elapsed:.0f} s"
    assert "PgS3cret" not in text and f"postgresql+psycopg://bob:***@127.0.0.1:{port}/mlflow" in text
    assert "timeout" in text.lower()


def test_engine_attempts_default_and_user_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.env import TRACKING_DEFAULTS

    monkeypatch.setattr(db_utils, "MAX_RETRY_COUNT", 10)
    assert TRACKING_DEFAULTS[DB_ATTEMPTS_ENV] == "3"
    monkeypatch.delenv(DB_ATTEMPTS_ENV, raising=False)
    configure_http_retries()
    assert db_utils.MAX_RETRY_COUNT == 3
    monkeypatch.setenv(DB_ATTEMPTS_ENV, "7")  # the user's value wins
    configure_http_retries()
    assert db_utils.MAX_RETRY_COUNT == 7
    monkeypatch.setenv(DB_ATTEMPTS_ENV, "lots")
    with pytest.raises(TrackingError, match=f"{DB_ATTEMPTS_ENV} = 'lots'"):
        configure_http_retries()


def test_the_cli_prints_one_line_and_exits_2(locked_db: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from components.cli import main

    monkeypatch.chdir(ROOT)  # params.yaml
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code = main(["promote", "--set", f"tracking.uri=sqlite:///{locked_db}", "--candidate",
                 "models:/agent-gspo-policy/1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("agent-gspo promote: error: open the registry failed on MLflow tracking URI")
    assert "Traceback" not in "\n".join(err) and "database is locked" in err[-1]


def test_a_backend_message_echoing_a_huge_request_is_cut(tmp_path: Path) -> None:
    """MLflow's refusal to change a logged parameter echoes both values: the error stays one short line."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = mlflow.MlflowClient(uri)
    run = client.create_run(client.create_experiment("e"))
    client.log_param(run.info.run_id, "k", "x" * 5_000)
    with pytest.raises(TrackingError) as info:
        guarded(uri, "logging a parameter", lambda: client.log_param(run.info.run_id, "k", "z" * 5_000))
    text = str(info.value)
    assert "logging a parameter failed on MLflow tracking URI" in text and "more characters)" in text
    assert len(text) < 1_000 and "\n" not in text


def test_a_password_at_the_cut_is_redacted_before_it() -> None:
    from mlflow.exceptions import MlflowException

    from components.tracking.backend import MAX_ERROR_CHARS

    secret = "http://user:hunter2hunter2@mlflow.example:5000/api"
    pad = "y" * (MAX_ERROR_CHARS - 20)  # the cut falls inside the URL, before its '@'
    with pytest.raises(TrackingError) as info:
        guarded("http://mlflow.example:5000", "op", lambda: (_ for _ in ()).throw(MlflowException(pad + secret)))
    assert "hunter2" not in str(info.value)
