"""MetricOutbox: queued metrics survive an outage of any length, arrive once and in order, keep
their step times, and what is unacknowledged is what a checkpoint stores; config hash ignores
tracking settings."""

import threading
import time
from pathlib import Path

import pytest

from components.config import load_config
from components.tracking.errors import TrackingError
from components.tracking.outbox import MetricOutbox, retry_until

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


class FlakyTracker:
    """Fails ``down_for`` calls (a server outage), then accepts; records what it received."""

    def __init__(self, down_for: int) -> None:
        self.down_for = down_for
        self.calls = 0
        self.received: list[tuple[int, int, dict]] = []
        self.lock = threading.Lock()

    def log_metric_rows(self, rows: list) -> None:
        with self.lock:
            self.calls += 1
            if self.calls <= self.down_for:
                raise TrackingError("log metrics failed on MLflow tracking URI http://h:5000: connection refused")
            self.received.extend(rows)


def test_rows_survive_a_long_outage_in_order_with_their_times() -> None:
    tracker, messages = FlakyTracker(down_for=200), []
    box = MetricOutbox(tracker, backoff_s=(0.001,), log=messages.append)
    try:
        for step in range(1, 31):
            box.put(step, {"train/reward": step / 10}, timestamp_ms=1_000 + step)
        assert box.drain(30)
        assert tracker.calls > 200  # it kept trying through the whole outage
        assert [r[0] for r in tracker.received] == list(range(1, 31))  # once each, in order
        assert [r[1] for r in tracker.received] == [1_000 + s for s in range(1, 31)]
        assert box.pending() == []
        assert any("unavailable" in m for m in messages) and any("is back" in m for m in messages)
        assert sum("unavailable" in m for m in messages) == 1  # one line per outage, not per attempt
    finally:
        box.close()


def test_pending_is_what_a_checkpoint_must_keep_and_restore_resends_it() -> None:
    tracker = FlakyTracker(down_for=10**9)  # never comes back
    box = MetricOutbox(tracker, backoff_s=(0.001,), log=lambda m: None)
    try:
        box.put(1, {"train/reward": 0.5}, timestamp_ms=11)
        box.put(2, {"train/reward": 0.25}, timestamp_ms=12)
        assert not box.drain(0.2)
        saved = box.pending()
        assert saved == [(1, 11, {"train/reward": 0.5}), (2, 12, {"train/reward": 0.25})]
    finally:
        box.close()
    later = FlakyTracker(down_for=0)
    resumed = MetricOutbox(later, backoff_s=(0.001,), log=lambda m: None)
    try:
        resumed.restore([list(r) for r in saved])  # as read back from extra.json
        assert resumed.drain(10) and later.received == saved
    finally:
        resumed.close()


def test_unknown_metric_names_fail_at_once() -> None:
    box = MetricOutbox(FlakyTracker(0), log=lambda m: None)
    try:
        with pytest.raises(ValueError):
            box.put(1, {"not/a-contract-name": 1.0})
    finally:
        box.close()


def test_retry_until_waits_for_recovery_and_gives_up_at_the_deadline() -> None:
    tracker = FlakyTracker(down_for=5)
    assert retry_until(lambda: tracker.log_metric_rows([(1, 1, {})]) or "ok", time.monotonic() + 10,
                       backoff_s=(0.01,), log=lambda m: None) == "ok"
    never = FlakyTracker(down_for=10**9)
    t0 = time.monotonic()
    with pytest.raises(TrackingError):
        retry_until(lambda: never.log_metric_rows([]), time.monotonic() + 0.3, backoff_s=(0.05,), log=lambda m: None)
    assert time.monotonic() - t0 < 5


def test_config_hash_ignores_tracking_settings() -> None:
    base = load_config(PARAMS)
    moved = load_config(PARAMS, overrides=["tracking.uri=http://u:p@elsewhere:5000", "tracking.experiment=x",
                                           "tracking.log_model=false", "tracking.outage_wait_s=5"])
    assert base.hash() == moved.hash()
    assert base.hash() != load_config(PARAMS, overrides=["gspo.lr=0.5"]).hash()
