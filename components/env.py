"""Offline-safety environment defaults applied by the project itself.

Imported first by ``components/__init__.py`` so every entry point (CLI, flows, DVC stages,
tests) makes no outside connection unless the user asks for the hub. Values already set by
the user win (``setdefault``), so ``HF_HUB_OFFLINE=0 agent-gspo prepare`` reaches the hub.
"""

from __future__ import annotations

import os

OFFLINE_DEFAULTS: dict[str, str] = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_UPDATE_DOWNLOAD_COUNTS": "false",
    "TOKENIZERS_PARALLELISM": "false",
}
TRACKING_DEFAULTS: dict[str, str] = {
    "AGENT_GSPO_MLFLOW_DB_ATTEMPTS": "3",
    "PGCONNECT_TIMEOUT": "10",
}
"""Bounds on MLflow's retries against a database backend that does not answer. MLflow (3.17) tries
to create its SQLAlchemy engine ``mlflow.store.db.utils.MAX_RETRY_COUNT`` = 10 times, sleeping
0.1 * (2**n - 1) s in between (about 100 s in all), and reads no variable for it:
:func:`components.tracking.backend.configure_http_retries` sets that constant from this one.
``PGCONNECT_TIMEOUT`` (libpq's, read by psycopg for MLflow's and Optuna's Postgres storage): without
it a Postgres that accepts the connection and never answers (a stopped server, a proxy whose backend
is gone) hangs the command forever; with it each attempt gives up after 10 s."""


def apply_offline_defaults() -> None:
    """Set each offline default (and each of :data:`TRACKING_DEFAULTS`) unless the variable is already set."""
    for key, value in {**OFFLINE_DEFAULTS, **TRACKING_DEFAULTS}.items():
        os.environ.setdefault(key, value)
    # datasets and transformers give their own switches priority over HF_HUB_OFFLINE: make them
    # follow it, so HF_HUB_OFFLINE=0 alone really reaches the hub.
    for key in ("HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(key, os.environ["HF_HUB_OFFLINE"])
