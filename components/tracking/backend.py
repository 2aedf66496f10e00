"""Backend plumbing shared by logging, model storage and promotion.

Bounded HTTP retries (MLflow reads these env vars on every request, so setting them at run
time takes effect) and database engine attempts, a fast reachability probe, error translation to
:class:`TrackingError` naming the URI (MLflow, HTTP, OS and SQLAlchemy errors, and a missing
database driver), and the git commit for provenance tags.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import requests
import sqlalchemy.exc
from mlflow.exceptions import MlflowException

from components.env import TRACKING_DEFAULTS
from components.redact import redact
from components.tracking.errors import RegistryRefusal, TrackingError

HTTP_RETRY_DEFAULTS: dict[str, str] = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
DB_ATTEMPTS_ENV = "AGENT_GSPO_MLFLOW_DB_ATTEMPTS"
"""How often MLflow tries to create its SQLAlchemy engine (default in :mod:`components.env`)."""
DB_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mssql", "oracle"})
"""URI schemes MLflow opens as a SQLAlchemy database (``<scheme>+<driver>://`` too)"""
BACKEND_ERRORS: tuple[type[BaseException], ...] = (MlflowException, requests.RequestException, OSError,
                                                    sqlalchemy.exc.SQLAlchemyError)
"""What a failing tracking backend raises (a database one raises SQLAlchemy's errors unwrapped)"""
T = TypeVar("T")


def configure_db_attempts() -> None:
    """Bound MLflow's SQLAlchemy engine attempts to ``$AGENT_GSPO_MLFLOW_DB_ATTEMPTS`` (default 3).

    MLflow retries a database that does not answer 10 times with exponential sleeps (~100 s),
    from the module constant ``mlflow.store.db.utils.MAX_RETRY_COUNT``, which no variable sets;
    it is read at each retry, so setting it here takes effect for every later store.
    """
    raw = os.environ.get(DB_ATTEMPTS_ENV, TRACKING_DEFAULTS[DB_ATTEMPTS_ENV])
    try:
        attempts = max(1, int(raw))
    except ValueError:
        raise TrackingError(f"${DB_ATTEMPTS_ENV} = {raw!r}: expected a whole number of attempts >= 1") from None
    import mlflow.store.db.utils as db_utils

    db_utils.MAX_RETRY_COUNT = attempts
    db_logger = logging.getLogger(db_utils.__name__)
    if not any(isinstance(f, _QuietEngineRetries) for f in db_logger.filters):
        db_logger.addFilter(_QuietEngineRetries())


class _QuietEngineRetries(logging.Filter):
    """Drop MLflow's multi-line "engine could not be created ... will be retried" warnings: the
    last attempt's error becomes the command's one-line :class:`TrackingError`, naming the cause."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SQLAlchemy engine could not be created")


def configure_http_retries(overrides: Mapping[str, str] | None = None) -> None:
    """Bound MLflow's retries: HTTP (:data:`HTTP_RETRY_DEFAULTS` unless already in the env) and the
    database engine attempts (:func:`configure_db_attempts`).

    ``overrides`` are set unconditionally (tests use them to fail fast).
    """
    for key, value in HTTP_RETRY_DEFAULTS.items():
        os.environ.setdefault(key, value)
    for key, value in (overrides or {}).items():
        os.environ[key] = str(value)
    configure_db_attempts()


def _is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))  # URI schemes are case-insensitive (RFC 3986)


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast with :class:`TrackingError` when an HTTP tracking server does not answer /health.

    Non-HTTP URIs (``sqlite:///``, ``postgresql://``, ``databricks``) are checked by their first
    real operation instead; for ``sqlite:///`` the parent folder is created so a fresh checkout
    works with ``sqlite:///runs/mlflow.db``.
    """
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        return
    if not _is_http(uri):
        return
    url = uri.rstrip("/") + "/health"
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.RequestException as exc:
        # "from None": the cause's message may carry the URI with its password (the message is redacted)
        raise TrackingError(
            f"MLflow tracking server {uri} is unreachable ({type(exc).__name__}: {exc}). Start it "
            f"(`mlflow server --host 127.0.0.1 --port 5000 ...`, or docker compose in infra/) or point "
            f"tracking.uri / MLFLOW_TRACKING_URI elsewhere (default sqlite:///mlflow.db).") from None
    if response.status_code != 200:
        raise TrackingError(f"MLflow tracking server {uri} answered {response.status_code} on /health: "
                            f"{response.text[:200]!r}")


def is_database_uri(uri: str) -> bool:
    """Is ``uri`` one MLflow opens with SQLAlchemy (``sqlite:``, ``postgresql+psycopg:`` ...)?"""
    scheme, sep, _ = uri.partition(":")
    return bool(sep) and scheme.split("+", 1)[0].lower() in DB_SCHEMES


_NOISE = ("(Background on this error at", "[SQL:", "[parameters:")
"""SQLAlchemy's extra lines: a link, and the statement with its bound values (which may hold data)"""


MAX_ERROR_CHARS = 500
"""a backend's message is cut here: an MLflow server's 400 echoes the whole request (a logged table, a
long parameter), which would bury the one line that says what failed"""


def one_line(exc: BaseException) -> str:
    """``exc``'s text as one line: SQLAlchemy's link and statement lines dropped, the rest joined, cut
    to :data:`MAX_ERROR_CHARS` (saying how much was left out). Redacted before the cut, which could
    otherwise leave a password without the ``@`` that marks it."""
    lines = [line.strip() for line in str(exc).splitlines()]
    text = redact("; ".join(line for line in lines if line and not line.startswith(_NOISE)) or type(exc).__name__)
    if len(text) > MAX_ERROR_CHARS:
        text = f"{text[:MAX_ERROR_CHARS]}... ({len(text) - MAX_ERROR_CHARS} more characters)"
    return text


RETRIED_STATUSES = frozenset({408, 409, 429})
"""4xx answers that are worth a retry: a timeout, a write conflict, a rate limit"""


def is_refusal(exc: BaseException) -> bool:
    """Did the backend answer and refuse (HTTP 4xx, or an MLflow error code that maps to one)?

    MLflow maps its error codes to HTTP statuses (``INVALID_PARAMETER_VALUE`` 400,
    ``RESOURCE_DOES_NOT_EXIST`` 404, ``RESOURCE_ALREADY_EXISTS`` 400, ``PERMISSION_DENIED`` 403) for
    its REST answers and its local stores alike; a connection that failed is ``INTERNAL_ERROR``
    (500) and a locked or unreachable database ``TEMPORARILY_UNAVAILABLE`` (503): those, and
    :data:`RETRIED_STATUSES`, are outages."""
    status: int | None = None
    if isinstance(exc, MlflowException):
        status = exc.get_http_status_code()
    elif isinstance(exc, requests.HTTPError) and exc.response is not None:
        status = exc.response.status_code
    if status is None or "database is locked" in str(exc):
        return False
    return 400 <= status < 500 and status not in RETRIED_STATUSES


def backend_error(uri: str, operation: str, exc: BaseException) -> TrackingError:
    """The one-line :class:`TrackingError` for ``exc`` raised by ``operation`` on ``uri``
    (a :class:`RegistryRefusal` when the backend refused it: :func:`is_refusal`)."""
    if is_refusal(exc):
        return RegistryRefusal(f"{operation} failed on MLflow tracking URI {uri}: {type(exc).__name__}: "
                               f"{one_line(exc)} (a refusal, not an outage: not retried)")
    hint = ""
    if isinstance(exc, ImportError):
        hint = (" (the database driver is not installed: install it, or name an installed driver "
                "in the URI, <scheme>+<driver>://...)")
    elif isinstance(exc, sqlalchemy.exc.ArgumentError) and uri.lower().startswith("sqlite:"):
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return TrackingError(f"{operation} failed on MLflow tracking URI {uri}: {type(exc).__name__}: {text} "
                             "(a sqlite URI is sqlite:///relative/path.db or sqlite:////absolute/path.db)")
    elif "database is locked" in str(exc):  # raw, or wrapped by MLflow in an MlflowException
        hint = " (another process holds a write lock on the database; retry when it is done)"
    return TrackingError(f"{operation} failed on MLflow tracking URI {uri}: {type(exc).__name__}: "
                         f"{one_line(exc)}{hint}")


def guarded(uri: str, operation: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; turn backend failures (:data:`BACKEND_ERRORS`, and for a database URI a missing
    driver's ``ImportError``) into a one-line :class:`TrackingError` naming ``uri``
    (password redacted; the original exception is not chained, its text may hold the password)."""
    try:
        return fn()
    except BACKEND_ERRORS as exc:
        # MlflowException messages hold the request URL (with any password): keep only the redacted text
        raise backend_error(uri, operation, exc) from None
    except ImportError as exc:
        if not (is_database_uri(uri) and _raised_by_sqlalchemy(exc)):  # not a driver: a bug, keep its traceback
            raise
        raise backend_error(uri, operation, exc) from None


def _raised_by_sqlalchemy(exc: BaseException) -> bool:
    """Did SQLAlchemy raise ``exc`` (loading a dialect's driver), rather than our code or MLflow's?"""
    tb = exc.__traceback__
    while tb is not None:
        if f"{os.sep}sqlalchemy{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def git_commit(path: str | os.PathLike[str] | None = None) -> str | None:
    """The checked-out commit sha, or None outside a git work tree / without git.

    ``AGENT_GSPO_GIT_COMMIT`` wins, for container images built without ``.git``.
    """
    if env := os.environ.get("AGENT_GSPO_GIT_COMMIT"):
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path or None, capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else None


