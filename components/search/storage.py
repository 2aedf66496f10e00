"""Opening the shared Optuna study: sqlite for one host, Postgres for several.

* ``sqlite:///path.db`` -- the parent folder is created; a 60 s busy timeout lets several
  worker processes on one host write without "database is locked" errors.
* ``postgresql+psycopg://user:pass@host/db`` -- several hosts; ``pool_pre_ping`` survives
  server-side idle disconnects.
* ``memory`` / ``:memory:`` -- one process, nothing persisted (tests, dry runs).

RDB storages get Optuna's heartbeat (60 s, grace 180 s): a worker that dies mid-trial leaves a
RUNNING trial whose token reservation would otherwise block the budget forever; with the
heartbeat the next worker's ``optimize`` marks it FAIL and its reservation stops growing stale.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError, OperationalError

from components.redact import redact as redact_text
from components.search.errors import SearchError

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 60
HEARTBEAT_GRACE_S = 180
_OPEN_RETRIES = 5
_TRANSIENT = (OperationalError, IntegrityError, optuna.exceptions.StorageInternalError)
"""Errors of workers racing to create the schema or the study, or of a database still starting."""


def redact(url: str | optuna.storages.BaseStorage) -> str:
    """``url`` with any password replaced by ``***`` (safe for logs, params and errors)."""
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    return redact_text(url)


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """Build the storage for ``url``; raise :class:`SearchError` naming the (redacted) URL."""
    if url in ("memory", ":memory:"):
        return optuna.storages.InMemoryStorage()
    if "://" not in url:
        raise SearchError(f"search.storage {url!r}: expected a URL such as sqlite:///optuna.db or "
                          f"postgresql+psycopg://user@host/db")
    engine_kwargs: dict[str, object] = {}
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            check_sqlite_file(path, url)
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    try:
        with warnings.catch_warnings():  # heartbeat_interval is "experimental" since Optuna 2.x
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                                 heartbeat_interval=HEARTBEAT_INTERVAL_S,
                                                 grace_period=HEARTBEAT_GRACE_S)
        if storage.engine.name == "sqlite":
            event.listen(storage.engine, "connect", _sqlite_wal)
            storage.engine.dispose()  # pooled connections were opened before the listener
        return storage
    except ImportError as exc:
        raise SearchError(f"search.storage {redact(url)}: database driver missing ({exc}); for Postgres "
                          f"install psycopg (`pip install 'psycopg[binary]'`)") from exc
    except Exception as exc:  # sqlalchemy ArgumentError / OperationalError / optuna errors
        raise SearchError(f"search.storage {redact(url)}: cannot open Optuna storage: {one_line(exc)}") from exc


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: SQLAlchemy appends the SQL and a "Background on this error" link on lines
    of their own; the driver's own message (``exc.orig``) says what went wrong."""
    orig = getattr(exc, "orig", None)
    text = f"{type(orig or exc).__name__}: {orig or exc}"
    return " ".join(text.split())


OPTUNA_TABLES = frozenset({"studies", "version_info", "alembic_version", "study_directions", "study_user_attributes",
                           "study_system_attributes", "trials", "trial_user_attributes", "trial_system_attributes",
                           "trial_params", "trial_values", "trial_intermediate_values", "trial_heartbeats"})
"""what Optuna's RDB schema creates (a schema another worker is still creating holds a subset)"""


def check_sqlite_file(path: str, url: str) -> None:
    """Refuse (:class:`SearchError`, one line) an existing file that is no SQLite database, a damaged one,
    or another application's database (MLflow's ``mlflow.db``): Optuna would have created its tables
    inside it and then failed with "update optuna". Read only; a missing or empty file is a new study."""
    file = Path(path)
    if file.is_dir():
        raise SearchError(f"search.storage {redact(url)}: {path} is a folder, not an SQLite database file")
    if path.startswith("file:") or not file.is_file() or file.stat().st_size == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True, timeout=60)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            problems = [" ".join(row[0].split()) for row in conn.execute("PRAGMA quick_check(3)") if row[0] != "ok"]
    except sqlite3.Error as exc:
        raise SearchError(f"search.storage {redact(url)}: {path} is not a usable SQLite database ({exc}); "
                          "move it away or give another --storage") from None
    if problems:
        raise SearchError(f"search.storage {redact(url)}: {path} is damaged (PRAGMA quick_check: "
                          f"{'; '.join(problems)}); move it away or give another --storage") from None
    foreign = sorted(tables - OPTUNA_TABLES - {"sqlite_sequence"})
    if foreign and "studies" not in tables:
        raise SearchError(f"search.storage {redact(url)}: {path} is another application's database ({len(foreign)} "
                          f"tables that are not Optuna's, e.g. {', '.join(foreign[:3])}), not an Optuna study; "
                          "give the search a file of its own (default sqlite:///optuna.db)")


def _sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    """WAL journal + ``synchronous=NORMAL`` for sqlite studies.

    Why: Optuna commits ~30 times per trial; with the default rollback journal every commit
    fsyncs (~20 ms each here), and readers block writers across worker processes. WAL lets
    workers read while one writes and fsyncs only at checkpoints; the cost is that a power
    loss may drop the last few commits, which a search tolerates. (WAL needs a local disk:
    use Postgres for studies shared across hosts.)
    """
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def close_storage(storage: optuna.storages.BaseStorage) -> None:
    """Checkpoint a SQLite study's write-ahead log into its ``.db`` file and close its connections.

    Why: in WAL mode (:func:`_sqlite_wal`) committed trials live in ``optuna.db-wal`` until a
    checkpoint, and the engine's pooled connections stay open until the process exits (or never
    close cleanly when it is killed); a copy of ``optuna.db`` alone then loads as "Record does not
    exist". ``wal_checkpoint(TRUNCATE)`` moves every committed page into the ``.db`` file and empties
    the log; disposing the engine closes the pool. Other storages only get their pool closed.
    A failed checkpoint (another process holds a read lock) is a warning: the trials are safe in the
    WAL, only a lone copy of the ``.db`` would lack them.

    The checkpoint runs on a fresh connection after the pool is closed: a pooled connection can
    still hold the statement of a query that a signal interrupted (Ctrl-C, SIGTERM mid-trial), and
    SQLite refuses to checkpoint on that connection ("database table is locked"), measured on a
    worker stopped by SIGTERM under load. A reader elsewhere only keeps the log from being emptied;
    when every page was still copied into the ``.db`` file (copied == frames), the file alone is
    complete and nothing is worth a warning.
    """
    backend = getattr(storage, "_backend", storage)  # optuna wraps an RDBStorage in a _CachedStorage
    engine = getattr(backend, "engine", None)
    if engine is None:  # in-memory (or another kind of) storage: nothing on disk to flush
        return
    with contextlib.suppress(Exception):  # optuna's scoped session, if one is still bound to this thread
        backend.remove_session()
    engine.dispose()
    database = engine.url.database if engine.name == "sqlite" else None
    if not database or database == ":memory:":
        return
    try:
        with contextlib.closing(sqlite3.connect(database, timeout=5.0, uri=database.startswith("file:"))) as conn:
            busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy and copied < frames:  # a reader's older snapshot kept the newest pages in the log only
            log.warning("search storage %s: the WAL checkpoint was blocked by another connection (%d of %d "
                        "pages copied); copy optuna.db together with optuna.db-wal", redact(str(engine.url)),
                        max(copied, 0), frames)
    except sqlite3.Error as exc:
        log.warning("search storage %s: WAL checkpoint failed (%s)", redact(str(engine.url)), exc)


def open_study(url: str | optuna.storages.BaseStorage, name: str,
               sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create or join study ``name`` (direction maximise) in ``url`` (a URL or a storage object).

    Retries a few times: workers started together race on creating the schema and the study,
    and the loser of that race gets a transient error rather than the existing study.
    """
    last: Exception | None = None
    for attempt in range(_OPEN_RETRIES):
        try:
            storage = make_storage(url) if isinstance(url, str) else url
            study = optuna.create_study(storage=storage, study_name=name, sampler=sampler,
                                        direction="maximize", load_if_exists=True)
        except (SearchError, OperationalError, optuna.exceptions.StorageInternalError,
                optuna.exceptions.DuplicatedStudyError) as exc:
            if isinstance(exc, SearchError) and not isinstance(exc.__cause__, _TRANSIENT):
                raise  # a bad URL or a missing driver: retrying cannot help
            last = exc
            time.sleep(0.2 * (attempt + 1))
            continue
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise SearchError(f"study {name!r} in {redact(url)} exists with direction {study.direction.name}; "
                              f"a search study maximises dev accuracy: use another search.study_name")
        return study
    if isinstance(last, SearchError):
        raise last
    raise SearchError(f"search.storage {redact(url)}: cannot open study {name!r}: {last}") from last
