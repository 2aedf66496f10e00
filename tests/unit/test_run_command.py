"""Every entry point ends the same way: one line on stderr and a documented exit code for bad input,
Ctrl-C, SIGTERM and a full disk; anything else keeps its traceback (a bug must stay visible)."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from components.errors import Terminated, UserError, run_command


def _raise(exc: BaseException):
    def fn() -> int:
        raise exc
    return fn


@pytest.mark.parametrize(("exc", "code", "line"), [
    (UserError("bad key x"), 2, "prog: error: bad key x"),
    (KeyboardInterrupt(), 130, "prog: interrupted (SIGINT); `--resume` continues from the newest checkpoint"),
    (Terminated(), 143, "prog: interrupted (SIGTERM); `--resume` continues from the newest checkpoint"),
    (OSError(errno.ENOSPC, "No space left on device", "/full/c"), 2, "prog: error: No space left on device: /full/c"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/x"), 2, "prog: error: Read-only file system: /ro/x"),
])
def test_each_ending_is_one_line_and_its_exit_code(exc, code, line, capsys):
    assert run_command("prog", _raise(exc), resumable=True) == code
    assert capsys.readouterr().err.splitlines() == [line]


def test_other_errors_keep_their_traceback():
    with pytest.raises(OSError, match="Permission denied"):
        run_command("prog", _raise(OSError(errno.EACCES, "Permission denied")))
    with pytest.raises(ZeroDivisionError):
        run_command("prog", _raise(ZeroDivisionError()))


def test_a_real_sigterm_unwinds_like_ctrl_c(capsys):
    """The handler turns the signal into an exception, so ``finally`` blocks (checkpoint cleanup,
    MLflow run end) run before the exit code 143."""
    cleaned = []

    def fn() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            return 0
        finally:
            cleaned.append(True)

    previous = signal.getsignal(signal.SIGTERM)
    assert run_command("prog", fn) == 143 and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is previous  # the caller's handler is back
    assert capsys.readouterr().err.strip() == "prog: interrupted (SIGTERM)"
