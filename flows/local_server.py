"""A temporary Prefect API for ``agent-gspo run`` that a terminal's Ctrl-C does not take down first.

Without ``PREFECT_API_URL`` Prefect starts its own temporary server as a child process in the
caller's process group. Ctrl-C in a terminal (or ``kill -INT -- -PGID``, ``timeout``) signals the
whole group, so that server died together with the flow it served; the flow then spent ~150 s
retrying to report its final state to the dead server and ended with exit 1 and connection
tracebacks, not the promised 130 / 143 with one line. Here the same temporary server (Prefect's
own :class:`SubprocessASGIServer`) is started in its own session, so the group's signal reaches only
the flow, which reports KILLED and returns; the server is stopped afterwards, and it is also
asked by the kernel to stop if this process dies without stopping it (``PR_SET_PDEATHSIG``), so
it never outlives the run. With ``PREFECT_API_URL`` set (a real server) nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

from components.errors import UserError
from components.io import check_writable_dir

PR_SET_PDEATHSIG = 1
DRAIN_TIMEOUT_S = 20.0
try:  # resolved here, in the parent: the child between fork and exec only makes the one call
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the session alone still keeps Ctrl-C away
    _PRCTL = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM))


@contextlib.contextmanager
def _own_session_popen() -> Iterator[None]:
    """While Prefect starts its server: every Popen in a new session that dies with its parent."""
    real = subprocess.Popen

    class Popen(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("start_new_session", True)
            kwargs.setdefault("preexec_fn", _die_with_parent)
            super().__init__(*args, **kwargs)

    subprocess.Popen = Popen  # type: ignore[misc]
    try:
        yield
    finally:
        subprocess.Popen = real  # type: ignore[misc]


@contextlib.contextmanager
def prefect_api() -> Iterator[str | None]:
    """The API the flow in the block reports to: ``PREFECT_API_URL`` when set, else a temporary
    server in its own session (its URL is yielded; None for a configured server)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield None
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_HOME

    home = PREFECT_HOME.value()  # the temporary server's database lives there: checked, not a start timeout
    check_writable_dir(home, "PREFECT_HOME (the temporary Prefect server keeps its database there)")
    server = SubprocessASGIServer()
    try:
        with _own_session_popen():
            server.start()
    except RuntimeError as exc:  # Prefect's "Timed out while attempting to connect ..." and its traceback
        raise UserError(f"the temporary Prefect server did not start ({exc}); PREFECT_HOME is {home}. "
                        "Set PREFECT_API_URL to use a running server (`prefect server start`)") from None
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            try:
                yield server.api_url
            finally:
                _send_what_is_queued()
    finally:
        server.stop()


def _send_what_is_queued(timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Flush Prefect's background log and event senders while their server still runs: queued at
    exit, they retried a stopped server for ~70 s (the "Error logging to API" after an interrupt)."""
    from prefect._internal.concurrency.services import QueueService

    with contextlib.suppress(Exception):  # best effort: a private API of Prefect's, and the run is over
        QueueService.drain_all(timeout=timeout_s)
