"""Per-step metrics that survive a tracking outage: buffered, sent by a background thread, retried.

Training must not stop, or lose a checkpoint, because the MLflow server is down for a while.
The training loop only *queues* each step's metrics (:meth:`MetricOutbox.put`, no network); a
daemon thread sends everything queued in one batch, and on a :class:`TrackingError` keeps the
rows, waits (1, 2, 5, 10, 30, then every 60 s) and tries again. Every failed try is one line
(``TrackingError: <first line of its message>``, URI password redacted; MLflow's own traceback of
a locked / unreachable database is dropped for that try), and one line says when the outage ends.
:meth:`pending` is what has not been acknowledged yet: training stores it in each checkpoint, so a
run resumed after a crash re-sends those rows.

:meth:`drain` waits (bounded) for the queue to empty at the end of training, and its answer is
final: it makes one more try just before its deadline, a try still in flight at the deadline is
waited for (up to :data:`SETTLE_S`) and decides, and after a ``False`` no new try starts, so
:meth:`pending` and :attr:`MetricOutbox.last_error` describe exactly what was not delivered (and a
later "is back" line can never contradict it). :meth:`close` starts no new try either.

Each row keeps the time its step finished, so the metric history shows when steps ran, not
when the server came back.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from components.redact import redact
from components.tracking.errors import RegistryRefusal, TrackingError
from components.tracking.metric_names import validate_metrics

if TYPE_CHECKING:
    from components.tracking.mlflow_logging import Tracker

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
LAST_TRY_S = 1.0
"""while :meth:`MetricOutbox.drain` waits, a try is always made this long before its deadline"""
SETTLE_S = 60.0
"""how long :meth:`MetricOutbox.drain` waits, past its deadline, for a try already in flight"""
QUIET_LOGGERS = ("mlflow.store.db.utils",)
"""MLflow loggers whose ERROR records (a traceback plus the SQL for every "database is locked")
are dropped while one of our tries runs: the try's own one-line message replaces them"""

Row = tuple[int, int, dict[str, float]]
"""(step, unix time in ms, metrics)"""

_quiet = threading.local()


class _DropDuringTry(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_quiet, "depth", 0) and record.levelno >= logging.ERROR)


_FILTER = _DropDuringTry()


@contextlib.contextmanager
def quiet_try() -> Iterator[None]:
    """Within this block (this thread only) the :data:`QUIET_LOGGERS` print no error tracebacks."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)  # idempotent
    _quiet.depth = getattr(_quiet, "depth", 0) + 1
    try:
        yield
    finally:
        _quiet.depth -= 1


def one_line(exc: BaseException, limit: int = 400) -> str:
    """``Type: first line of the message`` (URI passwords redacted, at most ``limit`` characters)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    line = redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
    return line if len(line) <= limit else line[:limit - 3] + "..."


class MetricOutbox:
    """Queue of metric rows for one tracker run (``tracker.log_metric_rows`` does the sending)."""

    def __init__(self, tracker: Tracker, *, backoff_s: tuple[float, ...] = BACKOFF_S,
                 log: Callable[[str], None] | None = None) -> None:
        self._tracker = tracker
        self._backoff = backoff_s
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._rows: list[Row] = []
        self._cond = threading.Condition()
        self._closed = False
        self._stopped = False  # a drain's deadline passed: no new try starts
        self._gave_up = False  # ... and it answered False (a try landing later is reported as late)
        self._sending = False  # a try is in flight
        self._hurry = False  # a drain began: try now, not at the end of the back-off
        self._drain_deadline: float | None = None
        self.down_since: float | None = None
        self.last_error: str | None = None
        """one line: the last failed try's error"""
        self.refused: str | None = None
        """one line: the server refused a batch (:class:`RegistryRefusal`): no try is made after it"""
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

    def _next_try(self, retry_at: float, started: float) -> float:
        """When to try again: the back-off, but while a drain waits never later than just before
        its deadline (unless the try that just failed already was that last one)."""
        deadline = self._drain_deadline
        if deadline is not None and started < deadline - LAST_TRY_S:
            return min(retry_at, deadline - LAST_TRY_S)
        return retry_at

    def _run(self) -> None:
        attempt = 0
        while True:
            with self._cond:
                while (not self._rows or self._stopped or self.refused) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = list(self._rows)
                self._sending = True
                self._hurry = False
            started = time.monotonic()
            try:
                with quiet_try():
                    self._tracker.log_metric_rows(batch)
            except RegistryRefusal as exc:
                with self._cond:
                    self.last_error = self.refused = one_line(exc)
                    self._sending = False
                    self._cond.notify_all()
                self._log(f"tracking refused the metrics ({self.refused}); not retried, the rows stay pending")
                continue
            except TrackingError as exc:
                attempt += 1
                wait = self._backoff[min(attempt - 1, len(self._backoff) - 1)]
                with self._cond:
                    self.last_error = one_line(exc)
                    self._sending = False
                    self._cond.notify_all()
                if self.down_since is None:
                    self.down_since = started
                    self._log(f"tracking unavailable ({self.last_error}); training goes on, metrics are kept and "
                              "sent when the server answers again")
                else:
                    self._log(f"tracking still unavailable, try {attempt} ({self.last_error})")
                retry_at = time.monotonic() + wait
                with self._cond:
                    while not (self._closed or self._stopped or self._hurry):
                        left = self._next_try(retry_at, started) - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)  # put() wakes this too: the loop keeps the back-off
                continue
            except BaseException:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()
                raise
            with self._cond:
                del self._rows[:len(batch)]
                self._sending = False
                late = self._gave_up  # the drain had already answered False
                self._cond.notify_all()
            if late:
                self._log(f"tracking took {len(batch)} buffered step(s) after the wait had ended; "
                          "--resume sends nothing twice")
            elif self.down_since is not None:
                self._log(f"tracking is back after {time.monotonic() - self.down_since:.0f} s; "
                          f"{len(batch)} buffered step(s) sent")
            self.down_since = None
            attempt = 0

    def drain(self, timeout_s: float, settle_s: float = SETTLE_S) -> bool:
        """Wait until every queued row is acknowledged (True) or ``timeout_s`` passes (False).

        A try in flight at the deadline is waited for (up to ``settle_s`` more) and counts. The
        answer is final: after False no new try starts and :meth:`pending` is what was not sent."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self.refused is not None:  # waiting cannot change a refusal
                return not self._rows
            self._drain_deadline = deadline
            self._hurry = True
            self._stopped = self._gave_up = False
            self._cond.notify_all()
            try:
                while self._rows and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(min(left, 1.0))
                if not self._rows:
                    return True
                self._stopped = True  # no new try: the answer below stays true
                self._cond.notify_all()
                settle_end = time.monotonic() + settle_s
                while self._sending and self._rows:
                    left = settle_end - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(min(left, 1.0))
                self._gave_up = bool(self._rows)
                self._stopped = self._gave_up  # delivered after all: the outbox goes on as before
                return not self._gave_up
            finally:
                self._drain_deadline = None
                self._hurry = False

    def close(self) -> None:
        """Stop the thread; no new try starts (rows still queued stay in :meth:`pending`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)


def retry_until(fn: Callable[[], Any], deadline: float, *, backoff_s: tuple[float, ...] = BACKOFF_S,
                log: Callable[[str], None] | None = None) -> Any:
    """``fn()``, retried on :class:`TrackingError` with back-off until ``time.monotonic()`` passes
    ``deadline``; then the last error is raised. One line per failed try, no traceback."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    attempt = 0
    while True:
        try:
            with quiet_try():
                return fn()
        except RegistryRefusal:
            raise  # the server answered "no": not an outage, waiting does not change the answer
        except TrackingError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            attempt += 1
            wait = min(backoff_s[min(attempt - 1, len(backoff_s) - 1)], left)
            if attempt == 1:
                say(f"tracking unavailable ({one_line(exc)}); retrying for up to {left:.0f} s")
            else:
                say(f"tracking still unavailable, try {attempt} ({one_line(exc)})")
            time.sleep(wait)
