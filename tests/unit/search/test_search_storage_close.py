"""Closing a SQLite study leaves every trial in ``optuna.db`` itself even when a pooled connection
still holds the statement of a query a signal cut short (seen once in CI: a worker stopped by
SIGTERM printed "WAL checkpoint failed (database table is locked)" beside its one "interrupted"
line), and warns only when a reader really kept pages out of the file."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest

from components.search.storage import close_storage, make_storage


def _storage_with_trials(db: Path, values: tuple[float, ...]) -> optuna.storages.BaseStorage:
    storage = make_storage(f"sqlite:///{db}")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize", load_if_exists=True)
    for value in values:
        study.add_trial(optuna.trial.create_trial(value=value))
    return storage


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _values_in_a_lone_copy(db: Path, tmp_path: Path) -> list[float]:
    copy = tmp_path / "elsewhere" / "optuna.db"
    copy.parent.mkdir()
    shutil.copy(db, copy)  # the .db file only, no -wal / -shm
    return [t.value for t in optuna.load_study(study_name="s", storage=f"sqlite:///{copy}").trials]


def test_a_statement_left_open_on_a_pooled_connection_does_not_block_the_checkpoint(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "optuna.db"
    storage = _storage_with_trials(db, (0.1, 0.2, 0.3))
    engine = getattr(storage, "_backend", storage).engine  # optuna may wrap it in a cache
    raw = engine.raw_connection()  # the pool's connection, as an interrupted query can leave it
    cursor = raw.driver_connection.cursor()
    cursor.execute("SELECT * FROM trials")
    cursor.fetchone()  # rows still pending: the statement stays open (and referenced, like a traceback's frame)
    raw.close()  # back to the pool, statement and all
    assert Path(f"{db}-wal").stat().st_size > 0
    with caplog.at_level(logging.WARNING, logger="components"):
        close_storage(storage)
    assert _warnings(caplog) == []
    assert _values_in_a_lone_copy(db, tmp_path) == [0.1, 0.2, 0.3]


def test_a_reader_that_keeps_pages_out_of_the_file_is_reported_not_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "optuna.db"
    close_storage(_storage_with_trials(db, (0.1,)))
    reader = sqlite3.connect(db)  # another process reading an older snapshot
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT * FROM trials").fetchall()
        storage = _storage_with_trials(db, (0.2, 0.3))  # committed after the reader's snapshot
        with caplog.at_level(logging.WARNING, logger="components"):
            close_storage(storage)
    finally:
        reader.close()
    messages = _warnings(caplog)
    assert len(messages) == 1 and "blocked by another connection" in messages[0], messages
    assert "copy optuna.db together with optuna.db-wal" in messages[0]
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")  # with its -wal: nothing lost
    assert [t.value for t in study.trials] == [0.1, 0.2, 0.3]
