"""Shared test setup: offline-safety defaults before any test imports transformers/datasets/mlflow."""

import os

import pytest

import components  # noqa: F401  (applies components.env offline defaults on import)


@pytest.fixture(autouse=True)
def _restore_mlflow_tracking_uri():
    """``mlflow.set_tracking_uri`` also sets ``$MLFLOW_TRACKING_URI``, which ``load_config`` honours:
    restore it after every test so one test's tracking server never leaks into the next."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before
