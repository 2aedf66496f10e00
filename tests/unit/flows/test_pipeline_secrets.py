"""`agent-gspo run` keeps secrets of its --set values out of the flow run's stored parameters."""

from __future__ import annotations

import os

import pytest

from components.errors import UserError
from flows.pipeline import TRACKING_URI_ENV, secrets_kept_out


def test_a_tracking_uri_with_a_password_travels_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACKING_URI_ENV, "sqlite:///before.db")
    sets = ["tracking.uri=sqlite:///x.db", "eval.limit=1", "tracking.uri=http://u:s3cret@h:5000"]
    with secrets_kept_out(sets) as safe:
        assert safe == ["eval.limit=1"]
        assert os.environ[TRACKING_URI_ENV] == "http://u:s3cret@h:5000"
    assert os.environ[TRACKING_URI_ENV] == "sqlite:///before.db"


def test_overrides_without_secrets_pass_unchanged() -> None:
    sets = ["eval.limit=1", "tracking.uri=http://h:5000"]
    with secrets_kept_out(sets) as safe:
        assert safe == sets


def test_another_secret_is_refused_naming_it_without_showing_it() -> None:
    with pytest.raises(UserError, match=r"search\.storage=postgresql://u:\*\*\*@h/db: holds a password") as err:
        with secrets_kept_out(["search.storage=postgresql://u:s3cret@h/db"]):
            pass
    assert "s3cret" not in str(err.value)
