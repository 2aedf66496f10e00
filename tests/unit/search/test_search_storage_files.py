"""A storage file that is no Optuna study is one line naming it (exit 2), and is left as it was.

Was: random bytes, a text file or a truncated study printed SQLAlchemy's three lines (the SQL and a
"Background on this error" link); a study with damaged pages said "An exception is raised during the
commit ... e.g. exceeding max length"; a folder said "unable to open database file"; and MLflow's
``mlflow.db`` given as the storage got Optuna's twelve tables created inside it, then failed with
"The runtime optuna version ... is no longer compatible ... pip install -U optuna"."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
import pytest

from components.search.errors import SearchError
from components.search.storage import close_storage, make_storage, open_study


def _study(db: Path) -> None:
    storage = make_storage(f"sqlite:///{db}")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=0.5))
    close_storage(storage)


def _damaged(tmp_path: Path) -> Path:
    _study(tmp_path / "good.db")
    data = bytearray((tmp_path / "good.db").read_bytes())
    data[4096:4096 * 3] = bytes(len(data[4096:4096 * 3]))  # zeroed pages: the header still says SQLite
    (tmp_path / "damaged.db").write_bytes(bytes(data))
    return tmp_path / "damaged.db"


def _other_apps(tmp_path: Path) -> Path:
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES ('1b5f0d9ad7c1')")
        conn.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()
    return db


@pytest.mark.parametrize("make, said", [
    (lambda t: (t / "r.db").write_bytes(bytes(range(256)) * 32) and t / "r.db", "is not a usable SQLite database"),
    (lambda t: (t / "t.db").write_text("hello\n") and t / "t.db", "is not a usable SQLite database"),
    (lambda t: (t / "d.db").mkdir() or t / "d.db", "is a folder"),
    (_damaged, "is damaged (PRAGMA quick_check|(database disk image is malformed)"),  # pages / schema
    (_other_apps, "is another application's database"),
])
def test_a_file_that_is_no_study_is_one_line_and_is_left_as_it_was(tmp_path: Path, make, said: str) -> None:
    path = make(tmp_path)
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(SearchError) as info:
        open_study(f"sqlite:///{path}", "s", optuna.samplers.RandomSampler(seed=0))
    message = str(info.value)
    assert any(s in message for s in said.split("|")) and str(path) in message and "\n" not in message, message
    assert "Background on this error" not in message and "pip install" not in message
    assert (path.read_bytes() if path.is_file() else None) == before  # mlflow.db got no Optuna tables


def test_a_study_an_empty_file_and_a_new_file_still_open(tmp_path: Path) -> None:
    _study(tmp_path / "study.db")
    (tmp_path / "empty.db").touch()
    for name in ("study.db", "empty.db", "new.db"):
        storage = make_storage(f"sqlite:///{tmp_path / name}")
        study = optuna.create_study(study_name="s", storage=storage, direction="maximize", load_if_exists=True)
        assert len(study.trials) == (1 if name == "study.db" else 0)
        close_storage(storage)
