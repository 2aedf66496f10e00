"""Backend plumbing shared by logging, model storage and promotion.

Bounded HTTP retries (MLflow reads these env vars on every request, so setting them at run
time takes effect), a fast reachability probe, error translation to :class:`TrackingError`
naming the URI, and the git commit for provenance tags.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import requests
from mlflow.exceptions import MlflowException

from components.tracking.errors import TrackingError

HTTP_RETRY_DEFAULTS: dict[str, str] = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
T = TypeVar("T")


def configure_http_retries(overrides: Mapping[str, str] | None = None) -> None:
    """Bound MLflow's HTTP retries: set :data:`HTTP_RETRY_DEFAULTS` unless already in the env.

    ``overrides`` are set unconditionally (tests use them to fail fast).
    """
    for key, value in HTTP_RETRY_DEFAULTS.items():
        os.environ.setdefault(key, value)
    for key, value in (overrides or {}).items():
        os.environ[key] = str(value)


def _is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


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


def guarded(uri: str, operation: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; turn MLflow / HTTP / OS failures into :class:`TrackingError` naming ``uri``
    (password redacted; the original exception is not chained, its text may hold the password)."""
    try:
        return fn()
    except (MlflowException, requests.RequestException, OSError) as exc:
        # MlflowException messages hold the request URL (with any password): keep only the redacted text
        raise TrackingError(f"{operation} failed on MLflow tracking URI {uri}: {type(exc).__name__}: {exc}") from None


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


