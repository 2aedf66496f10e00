"""What the gate reads must be sound: stored numbers finite and in range (named by version and
tag), and only READY versions compete (sqlite:///)."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest
from helpers.paths import load_test_module

from components.tracking import PromotionError, read_result

test_tracking_helpers = load_test_module("test_tracking_helpers")
test_tracking_promotion = load_test_module("test_tracking_promotion")
KEY = load_test_module("test_tracking_promotion").KEY
_alias = load_test_module("test_tracking_promotion")._alias
promote = load_test_module("test_tracking_promotion").promote

mlflow_uri = test_tracking_helpers.mlflow_uri  # shared pytest fixtures
setup = test_tracking_promotion.setup


@pytest.mark.parametrize(("who", "tag", "value", "problem"), [
    ("candidate", "accuracy", "nan", "is not finite"), ("candidate", "accuracy", "1.5", r"is outside \[0, 1\]"),
    ("candidate", "tokens_total", "inf", "is not finite"), ("champion", "tokens_total", "-5.0", "is negative"),
    ("champion", "accuracy", "-0.1", r"is outside \[0, 1\]"),
])
def test_a_bad_result_names_the_version_its_role_and_the_tag(setup, who: str, tag: str, value: str,
                                                             problem: str) -> None:
    client, new = setup
    v1 = new("m", 0.6, 100)
    promote(client, "m", v1)
    v2 = new("m", 0.6, 100)
    bad = v2 if who == "candidate" else v1
    client.set_model_version_tag("m", bad, f"eval.{KEY}.{tag}", value)
    with pytest.raises(PromotionError, match=f"{who} models:/m/{bad}: tag eval.{KEY}.{tag} = '{value}' {problem}"):
        promote(client, "m", v2)


def test_the_decision_numbers_are_always_valid_json(setup) -> None:
    client, new = setup
    v1 = new("m", 0.6, 100)
    promote(client, "m", v1)
    decision = promote(client, "m", new("m", 0.7, 90))
    json.dumps(decision.metrics_used, allow_nan=False)
    assert all(math.isfinite(v) for v in decision.metrics_used.values() if isinstance(v, float))


def test_read_result_still_reads_good_tags() -> None:
    tags = {f"eval.{KEY}.accuracy": "1.0", f"eval.{KEY}.tokens_total": "0.0", f"eval.{KEY}.n": "3"}
    assert read_result(tags, KEY, "v1").accuracy == 1.0


def _set_status(uri: str, name: str, version: str, status: str) -> None:
    with sqlite3.connect(uri.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE model_versions SET status=? WHERE name=? AND version=?", (status, name, int(version)))


def test_a_candidate_that_is_not_ready_is_refused(mlflow_uri: str, setup) -> None:
    client, new = setup
    v1 = new("m", 0.6, 100)
    _set_status(mlflow_uri, "m", v1, "FAILED_REGISTRATION")
    with pytest.raises(PromotionError, match=f"candidate models:/m/{v1} has status FAILED_REGISTRATION, not READY"):
        promote(client, "m", v1)
    assert _alias(client, "m", "champion") is None
    assert "promotion.decision" not in client.get_model_version("m", v1).tags


def test_a_champion_that_is_not_ready_counts_as_none(mlflow_uri: str, setup,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    client, new = setup
    v1 = new("m", 0.8, 100)
    promote(client, "m", v1)
    _set_status(mlflow_uri, "m", v1, "PENDING_REGISTRATION")
    v2 = new("m", 0.6, 100)
    with caplog.at_level("WARNING"):
        d = promote(client, "m", v2)
    assert f"@champion of 'm' is v{v1} with status PENDING_REGISTRATION, not READY: treated as no champion" \
        in caplog.text
    assert d.compared_to == v1 and d.decision == "challenger"  # the decision history still holds the bar
    v3 = new("m", 1.0, 100)
    assert promote(client, "m", v3).decision == "champion" and _alias(client, "m", "champion") == v3
