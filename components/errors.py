"""Errors that mean "the user gave bad input": the CLI prints them and exits 2; and
:func:`run_command`, the one place that turns them (and Ctrl-C, SIGTERM, a full disk) into one line
and an exit code for every entry point (``agent-gspo``, the per-rank training launcher)."""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable

from components.redact import redact


class UserError(Exception):
    """Bad input (config, file, flag). The message names what is wrong and where.

    A URI password in the message is replaced by ``***`` (:func:`components.redact.redact`):
    these messages are printed, logged by Prefect and stored in run results."""

    exit_code = 2

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ProcessFailed(Exception):
    """A child process the command ran (a training launch) failed; its own output, above, says why.
    One line and exit 1, not a traceback of the parent that only waited for it."""

    exit_code = 1

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C: ``finally`` blocks run, so an MLflow run ends KILLED instead of
    staying RUNNING forever and a checkpoint being written is cleaned up."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


PARENT_REPORTS_INTERRUPT = "AGENT_GSPO_PARENT_REPORTS_INTERRUPT"
"""set to 1 in the environment of processes that ``agent-gspo`` launched and streams (training ranks,
:func:`components.runtime.launch.launch_env`): on Ctrl-C or SIGTERM they exit 130 / 143 without their
own line, since the whole process group got the signal and the parent prints the one line"""

ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
"""OS errors that say where a write failed (disk full, quota, read-only), not a bug: one line, exit 2"""


def run_command(prog: str, fn: Callable[[], int], *, resumable: bool = False) -> int:
    """Run ``fn`` and map what ends it to one line on stderr and an exit code: a :class:`UserError`
    (its code, 2), a :class:`ProcessFailed` child (1), Ctrl-C (130) or SIGTERM (143), and a full disk /
    quota / read-only file system (2, naming the path). Anything else is a bug and keeps its traceback."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return fn()
    except (UserError, ProcessFailed) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        name, code = ("SIGTERM", 143) if isinstance(exc, Terminated) else ("SIGINT", 130)
        hint = "; `--resume` continues from the newest checkpoint" if resumable else ""
        if os.environ.get(PARENT_REPORTS_INTERRUPT) != "1":
            print(f"{prog}: interrupted ({name}){hint}", file=sys.stderr)
        return code
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"{prog}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:  # a library caller (or pytest) gets its own handler back
            signal.signal(signal.SIGTERM, previous)
