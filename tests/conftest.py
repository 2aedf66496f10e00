"""Shared test setup: offline-safety defaults before any test imports transformers/datasets/mlflow."""

import components  # noqa: F401  (applies components.env offline defaults on import)
