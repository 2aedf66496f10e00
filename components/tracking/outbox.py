"""Per-step metrics that survive a tracking outage: buffered, sent by a background thread, retried.

Training must not stop, or lose a checkpoint, because the MLflow server is down for a while.
The training loop only *queues* each step's metrics (:meth:`MetricOutbox.put`, no network); a
daemon thread sends everything queued in one batch, and on a :class:`TrackingError` keeps the
rows, waits (1, 2, 5, 10, 30, then every 60 s) and tries again, printing one line when the
outage starts and one when it ends. :meth:`pending` is what has not been acknowledged yet:
training stores it in each checkpoint, so a run resumed after a crash re-sends those rows.
:meth:`drain` waits (bounded) for the queue to empty at the end of training.

Each row keeps the time its step finished, so the metric history shows when steps ran, not
when the server came back.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from components.tracking.errors import TrackingError
from components.tracking.metric_names import validate_metrics

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

Row = tuple[int, int, dict[str, float]]
"""(step, unix time in ms, metrics)"""


class MetricOutbox:
    """Queue of metric rows for one tracker run (``tracker.log_metric_rows`` does the sending)."""

    def __init__(self, tracker: Any, *, backoff_s: tuple[float, ...] = BACKOFF_S,
                 log: Callable[[str], None] | None = None) -> None:
        self._tracker = tracker
        self._backoff = backoff_s
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._rows: list[Row] = []
        self._cond = threading.Condition()
        self._closed = False
        self.down_since: float | None = None
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="metric-outbox", daemon=True)
        self._thread.start()

    def put(self, step: int, metrics: Mapping[str, Any], timestamp_ms: int | None = None) -> None:
        """Queue one step's metrics (names validated now: an unknown name is a bug, raised here)."""
        row = (int(step), timestamp_ms or int(time.time() * 1000), validate_metrics(metrics))
        with self._cond:
            self._rows.append(row)
            self._cond.notify_all()

    def restore(self, rows: list[Any]) -> None:
        """Queue rows saved in a checkpoint by :meth:`pending` (sent again after a resume)."""
        for step, ts, metrics in rows:
            self.put(step, metrics, ts)

    def pending(self) -> list[Row]:
        """Rows not yet acknowledged by the server, oldest first (JSON-serialisable)."""
        with self._cond:
            return [(s, t, dict(m)) for s, t, m in self._rows]

    def _run(self) -> None:
        attempt = 0
        while True:
            with self._cond:
                while not self._rows and not self._closed:
                    self._cond.wait()
                if not self._rows:
                    return
                batch = list(self._rows)
            try:
                self._tracker.log_metric_rows(batch)
            except TrackingError as exc:
                self.last_error = str(exc)
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    self._log(f"tracking unavailable: {exc}; training goes on, metrics are kept and sent "
                              "when the server answers again")
                wait = self._backoff[min(attempt, len(self._backoff) - 1)]
                attempt += 1
                with self._cond:
                    if self._closed:
                        return
                    self._cond.wait(wait)
                continue
            with self._cond:
                del self._rows[:len(batch)]
                self._cond.notify_all()
            if self.down_since is not None:
                self._log(f"tracking is back after {time.monotonic() - self.down_since:.0f} s; "
                          f"{len(batch)} buffered step(s) sent")
                self.down_since = None
            attempt = 0

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued row is acknowledged (True) or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.notify_all()
            while self._rows:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def close(self) -> None:
        """Stop the thread (rows still queued stay in :meth:`pending`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)


def retry_until(fn: Callable[[], Any], deadline: float, *, backoff_s: tuple[float, ...] = BACKOFF_S,
                log: Callable[[str], None] | None = None) -> Any:
    """``fn()``, retried on :class:`TrackingError` with back-off until ``time.monotonic()`` passes
    ``deadline``; then the last error is raised."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    attempt = 0
    while True:
        try:
            return fn()
        except TrackingError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if attempt == 0:
                say(f"tracking unavailable ({exc}); retrying for up to {left:.0f} s")
            time.sleep(min(backoff_s[min(attempt, len(backoff_s) - 1)], left))
            attempt += 1
