"""Registry names are checked at config load; a registry's refusal is an error at once, not an outage.

Was: ``registry.model_name=../../evil`` (or ``a/b``, a blank name) loaded and failed only when
training registered its model; and a refusal (``INVALID_PARAMETER_VALUE``, any 4xx) was retried like a
server that is down, for up to ``tracking.outage_wait_s`` (900 s) at the end of training.
"""

from __future__ import annotations

import time

import pytest
import requests
from helpers.paths import REPO_ROOT
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos.databricks_pb2 import (
    INTERNAL_ERROR,
    INVALID_PARAMETER_VALUE,
    RESOURCE_ALREADY_EXISTS,
    TEMPORARILY_UNAVAILABLE,
)
from mlflow.utils.validation import _validate_model_name

from components.config import ConfigError, load_config
from components.config_sections import model_name_problem
from components.tracking.backend import guarded, is_refusal
from components.tracking.errors import RegistryRefusal, TrackingError
from components.tracking.outbox import MetricOutbox, retry_until

ROOT = REPO_ROOT
URI = "http://127.0.0.1:5000"


@pytest.mark.parametrize("name", ["../../evil", "a/b", "a:b", "..", ".", "./x", "x/", "a@b", "   ", " padded"])
def test_a_name_the_registry_cannot_hold_is_refused_at_config_load_naming_the_key(name: str) -> None:
    with pytest.raises(ConfigError, match=r"registry\.model_name: .*not a registered model name"):
        load_config(ROOT / "params.yaml", None, [f"registry.model_name='{name}'"])


def test_an_empty_name_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"registry\.model_name"):
        load_config(ROOT / "params.yaml", None, ["registry.model_name=''"])


@pytest.mark.parametrize("name", ["agent-gspo-policy", "team_v2.1", "a b", "x..y", "Ünïcode", "../../evil", "a/b",
                                  "a:b", "..", ".", "./x", "x/.", "", "  ", "/abs"])
def test_every_name_mlflow_refuses_is_refused_here(name: str) -> None:
    try:
        _validate_model_name(name)
    except MlflowException:
        assert model_name_problem(name) is not None
    else:
        assert model_name_problem(name) is None or "@" in name or name != name.strip()


def _raise(exc: BaseException):
    def fn():
        raise exc
    return fn


@pytest.mark.parametrize("exc", [
    MlflowException("Invalid model name", error_code=INVALID_PARAMETER_VALUE),
    MlflowException("exists", error_code=RESOURCE_ALREADY_EXISTS),
    RestException({"error_code": "PERMISSION_DENIED", "message": "no"}),
    RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "gone"}),
])
def test_a_refusal_is_a_registry_refusal(exc: BaseException) -> None:
    assert is_refusal(exc)
    with pytest.raises(RegistryRefusal, match="failed on MLflow tracking URI .*a refusal, not an outage: not retried"):
        guarded(URI, "register", _raise(exc))


@pytest.mark.parametrize("exc", [
    MlflowException("API request to http://h failed with exception ConnectionError", error_code=INTERNAL_ERROR),
    MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE),
    RestException({"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "slow down"}),
    requests.ConnectionError("refused"),
    OSError("network unreachable"),
])
def test_connection_errors_and_5xx_are_outages(exc: BaseException) -> None:
    assert not is_refusal(exc)
    with pytest.raises(TrackingError) as info:
        guarded(URI, "register", _raise(exc))
    assert not isinstance(info.value, RegistryRefusal)


def test_retry_until_raises_a_refusal_at_once_and_retries_an_outage() -> None:
    calls: list[int] = []

    def refused():
        calls.append(1)
        guarded(URI, "register", _raise(MlflowException("bad name", error_code=INVALID_PARAMETER_VALUE)))

    started = time.monotonic()
    with pytest.raises(RegistryRefusal):
        retry_until(refused, time.monotonic() + 900, backoff_s=(0.01,), log=lambda _: None)
    assert len(calls) == 1 and time.monotonic() - started < 5

    outage: list[int] = []

    def down_then_up():
        outage.append(1)
        if len(outage) < 3:
            guarded(URI, "register", _raise(requests.ConnectionError("refused")))
        return "v1"

    assert retry_until(down_then_up, time.monotonic() + 900, backoff_s=(0.01,), log=lambda _: None) == "v1"
    assert len(outage) == 3


class _RefusingTracker:
    def __init__(self) -> None:
        self.tries = 0

    def log_metric_rows(self, rows) -> None:
        self.tries += 1
        guarded(URI, "log metrics", _raise(RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "x"})))


def test_the_metric_outbox_stops_at_a_refusal_and_its_drain_answers_at_once() -> None:
    tracker = _RefusingTracker()
    lines: list[str] = []
    outbox = MetricOutbox(tracker, backoff_s=(0.01,), log=lines.append)
    try:
        outbox.put(1, {"train/reward": 0.5})
        deadline = time.monotonic() + 10
        while outbox.refused is None and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        assert outbox.drain(900) is False
        assert time.monotonic() - started < 5
        time.sleep(0.1)
        assert tracker.tries == 1 and len(outbox.pending()) == 1
        assert any("refused the metrics" in line and "not retried" in line for line in lines), lines
    finally:
        outbox.close()
