"""Registry lookups with a careless URI: one-line errors (exit 2), and a lookup never creates a database."""

from __future__ import annotations

import pytest

from components.tracking.errors import ModelUriError, TrackingError
from components.tracking.versions import parse_models_uri, registry_client


@pytest.mark.parametrize(("text", "expected"), [
    ("models:/pol/0", r"no version 0 \(registry versions count from 1\)"),
    ("models:/pol/99999999999999999999999", "no version 99999999999999999999999"),
    ("models:/pol/\u0661", "expected models:/<name>"),  # an Arabic-Indic one is not version 1
    ("models:/pol/Production", "stages are not used"),
])
def test_versions_outside_the_registry_range_are_refused_before_any_lookup(text, expected):
    with pytest.raises(ModelUriError, match=expected):
        parse_models_uri(text)


def test_version_numbers_parse():
    assert parse_models_uri("models:/pol/12") == ("pol", "12", None)
    assert parse_models_uri("models:/pol@champion") == ("pol", None, "champion")


def test_a_lookup_in_a_missing_sqlite_database_neither_creates_it_nor_succeeds(tmp_path):
    db = tmp_path / "sub" / "mlflow.db"
    with pytest.raises(TrackingError, match=f"no MLflow database at {db}"):
        registry_client(f"sqlite:///{db}")
    assert not db.exists() and not db.parent.exists()


@pytest.mark.parametrize("uri", ["ftp://x/y", "garbage-folder"])
def test_a_tracking_uri_mlflow_cannot_open_is_a_tracking_error(uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrackingError, match=f"open the registry failed on MLflow tracking URI {uri}"):
        registry_client(uri)
