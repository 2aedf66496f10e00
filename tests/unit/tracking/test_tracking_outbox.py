"""MetricOutbox: queued metrics survive an outage of any length, arrive once and in order, keep
their step times, and what is unacknowledged is what a checkpoint stores; config hash ignores
tracking settings."""
import logging
import threading
import time

import pytest
from helpers.paths import REPO_ROOT

from components.config import load_config
from components.tracking.errors import TrackingError
from components.tracking.outbox import QUIET_LOGGERS, MetricOutbox, retry_until

PARAMS = REPO_ROOT / "params.yaml"


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
        assert sum(m.startswith("tracking unavailable") for m in messages) == 1  # one outage
        assert sum("unavailable" in m for m in messages) == 200  # then one line per failed try
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


class SlowComeback:
    """The server answers again while the drain waits: every try fails (instantly) until ``up_at``;
    the first try after that takes ``call_s`` (a locked sqlite database finally letting go)."""

    def __init__(self, up_at: float, call_s: float) -> None:
        self.up_at, self.call_s = up_at, call_s
        self.received: list = []
        self.tries: list[float] = []

    def log_metric_rows(self, rows: list) -> None:
        now = time.monotonic()
        self.tries.append(now)
        if now < self.up_at:
            raise TrackingError("log metrics failed on MLflow tracking URI sqlite:///m.db: database is locked")
        time.sleep(self.call_s)
        self.received.extend(rows)


def test_a_delivery_in_flight_at_the_deadline_counts_and_the_messages_agree() -> None:
    """The hostile run: the last try started before the deadline and was acknowledged just after;
    drain answered False with the rows still counted, and "is back ... sent" came next."""
    tracker, messages = SlowComeback(up_at=time.monotonic() + 0.3, call_s=1.0), []
    box = MetricOutbox(tracker, backoff_s=(0.05,), log=messages.append)
    try:
        for step in (1, 2, 3):
            box.put(step, {"train/reward": 0.1})
        t0 = time.monotonic()
        assert box.drain(0.6)  # the try started at ~0.3 s ends at ~1.3 s, after the deadline: it counts
        assert time.monotonic() - t0 >= 1.0
        assert box.pending() == [] and [r[0] for r in tracker.received] == [1, 2, 3]
        assert any("is back" in m and "3 buffered" in m for m in messages)
    finally:
        box.close()


def test_a_try_is_made_just_before_the_deadline_even_in_a_long_back_off() -> None:
    tracker, messages = SlowComeback(up_at=time.monotonic() + 0.3, call_s=0.0), []
    box = MetricOutbox(tracker, backoff_s=(60.0,), log=messages.append)  # next regular try: in a minute
    try:
        box.put(1, {"train/reward": 0.1})
        assert box.drain(1.5)  # tries at ~0 s (fails) and at ~0.5 s (1 s before the deadline)
        assert len(tracker.tries) == 2 and tracker.received
    finally:
        box.close()


def test_a_false_drain_is_final_no_later_try_contradicts_it() -> None:
    tracker, messages = FlakyTracker(down_for=10**9), []
    box = MetricOutbox(tracker, backoff_s=(0.01,), log=messages.append)
    try:
        box.put(1, {"train/reward": 0.5}, timestamp_ms=11)
        assert not box.drain(0.2)
        calls, unsent = tracker.calls, box.pending()
        tracker.down_for = 0  # the server comes back while the error is being reported
        time.sleep(0.2)
    finally:
        box.close()  # starts no try either
    assert tracker.calls == calls and tracker.received == []
    assert box.pending() == unsent == [(1, 11, {"train/reward": 0.5})]
    assert not any("is back" in m for m in messages)
    assert box.last_error is not None and "\n" not in box.last_error


def test_a_try_still_in_flight_after_the_settle_time_is_reported_as_late() -> None:
    tracker, messages = SlowComeback(up_at=0.0, call_s=0.6), []
    box = MetricOutbox(tracker, log=messages.append)
    try:
        box.put(1, {"train/reward": 0.1})
        assert not box.drain(0.1, settle_s=0.1)
        assert len(box.pending()) == 1  # what the error message counts
        box.close()  # waits for the try in flight
        assert not any("is back" in m for m in messages)
        assert any("after the wait had ended" in m for m in messages)
    finally:
        box.close()


SQL_ERROR = ("log metrics failed on MLflow tracking URI http://bob:s3cret@h:5000: MlflowException: "
             "(sqlite3.OperationalError) database is locked\n"
             "[SQL: SELECT runs.run_uuid FROM runs WHERE runs.run_uuid = ?]"
             "\n[parameters: ('abc',)]\n(Background on this error at: https://sqlalche.me/e/21/e3q8)")


class LockedDb:
    """Fails like MLflow's SQL store on a locked database: MLflow's logger prints the traceback."""

    def __init__(self, down_for: int) -> None:
        self.down_for, self.calls, self.received = down_for, 0, []

    def log_metric_rows(self, rows: list) -> None:
        self.calls += 1
        if self.calls <= self.down_for:
            try:
                raise RuntimeError("(sqlite3.OperationalError) database is locked")
            except RuntimeError:
                logging.getLogger(QUIET_LOGGERS[0]).exception("SQLAlchemy database error. The following ...")
            raise TrackingError(SQL_ERROR)
        self.received.extend(rows)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_each_failed_try_is_one_redacted_line_without_traceback() -> None:
    handler, db_logger = ListHandler(), logging.getLogger(QUIET_LOGGERS[0])
    db_logger.addHandler(handler)
    try:
        tracker, messages = LockedDb(down_for=4), []
        box = MetricOutbox(tracker, backoff_s=(0.001,), log=messages.append)
        try:
            box.put(1, {"train/reward": 0.5})
            assert box.drain(10)
        finally:
            box.close()
        fails = [m for m in messages if "unavailable" in m]
        assert len(fails) == 4 and all("\n" not in m for m in messages)
        assert all("TrackingError: log metrics failed on MLflow tracking URI http://bob:***@h:5000: "
                   "MlflowException: (sqlite3.OperationalError) database is locked" in m for m in fails)
        assert not any("s3cret" in m or "[SQL" in m for m in messages)
        again, said = LockedDb(down_for=3), []
        assert retry_until(lambda: again.log_metric_rows([]) or "ok", time.monotonic() + 10, backoff_s=(0.001,),
                           log=said.append) == "ok"
        assert len(said) == 3 and all("\n" not in m and "TrackingError: " in m and "[SQL" not in m for m in said)
        assert handler.records == []  # MLflow's traceback was dropped during our tries ...
        db_logger.error("outside a try")
        assert len(handler.records) == 1  # ... and only then
    finally:
        db_logger.removeHandler(handler)
