"""Errors that mean "the user gave bad input": the CLI prints them and exits 2; and
:func:`run_command`, the one place that turns them (and Ctrl-C, SIGTERM, a full disk) into one line
and an exit code for every entry point (``agent-gspo``, the per-rank training launcher). A bad flag is
one line and exit 2 too: every entry point parses with :class:`OneLineParser`."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn

from components.redact import redact

MAX_SHOWN = 120
"""longest value, key path, override or argument an error message quotes in full (then ``...``): a
100,000-character ``--set`` was repeated whole in its one-line error"""

MAX_USAGE_ERROR = 4 * MAX_SHOWN
"""longest usage error (argparse's message) shown whole; the longest one a typo gets, an unknown command
with the eleven commands it could be, is about 210 characters"""


def _clipped(message: str) -> str:
    """argparse's message as one line of at most :data:`MAX_USAGE_ERROR` characters: it quotes the
    arguments it refuses whole (an unknown 100,000-character option, a newline in a value), and a URI
    password in them becomes ``***``."""
    words = [w if len(w) <= MAX_SHOWN else w[:MAX_SHOWN - 3] + "..." for w in redact(message).split()]
    text = " ".join(words)
    return text if len(text) <= MAX_USAGE_ERROR else text[:MAX_USAGE_ERROR - 3] + "..."


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose usage errors (an unknown command or option, a missing
    argument, a value of the wrong type or not among the choices, no command at all) are one line
    naming what is wrong, pointing to ``--help``, and exit 2, instead of the usage block and the message:
    ``agent-gspo train: error: unrecognized arguments: --bogus (see agent-gspo train --help)``.
    ``--help`` is unchanged. Subparsers are of the same class (``add_subparsers`` makes them with
    ``type(self)``), so each names its own command."""

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, but an unrecognized argument is blamed on the command it was given to
        (argparse collects them from every subparser and reports them on the top-level parser)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._chosen(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost (sub)parser that ``parsed`` selected: ``agent-gspo config keys`` for
        ``agent-gspo config keys --bogus``."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(parsed, action.dest, None))
                if isinstance(sub, OneLineParser):
                    return sub._chosen(parsed)
        return self

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_clipped(message)} (see {self.prog} --help)\n")


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
