"""How a sandboxed program ended, in words: the :class:`SandboxResult` of
:mod:`components.scoring.sandbox`, built from the program's wait status, its stderr and (task
mode) the judge's verdict (see sandbox_judge.py)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from dataclasses import dataclass

_REFUSED = "PermissionError: [Errno 1] Operation not permitted"
_REFUSED_HINT = (" (refused by the sandbox: a new process -- fork, subprocess, multiprocessing -- memfd, SysV IPC "
                 "or a unix socket; threads work)")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program.

    ``reason`` is ``"passed"`` or starts with a category: ``timeout``, ``exception``,
    ``early-exit``, ``signal``, ``cpu-limit``, ``file-size-limit``, ``memory``, ``sandbox``.
    ``isolation`` is how it ran: ``root`` or ``userns`` (namespaces) or ``unsafe``.
    """

    passed: bool
    reason: str
    stdout_tail: str
    stderr_tail: str
    duration_s: float
    isolation: str | None = None


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*)?$")


def ended_reason(status: int | None, stderr: str) -> str:
    """Why a program that stopped answering ended, from its wait status and stderr."""
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if status is None:
        return "early-exit: the program ended" + (f" ({last[:200]})" if last else "")
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status))
        if sig == signal.SIGXCPU:
            return "cpu-limit: CPU time limit exceeded (SIGXCPU)"
        if sig == signal.SIGXFSZ:
            return "file-size-limit: file size limit exceeded (SIGXFSZ)"
        return f"signal: killed by {sig.name}"
    code = os.WEXITSTATUS(status)
    if last.startswith("MemoryError"):
        return "memory: MemoryError (address-space limit)"
    if code == 1 and _EXC_LINE.match(last):
        return f"exception: {last[:300]}" + (_REFUSED_HINT if last.startswith(_REFUSED) else "")
    if code == 0:
        return "early-exit: exited with status 0 before the program finished (sys.exit/os._exit?)"
    return f"early-exit: exit status {code} before the program finished" + (f" ({last[:200]})" if last else "")


def task_result(verdict: dict | None, status: int | None, got: SandboxResult, timeout_s: float) -> SandboxResult:
    """The task's result from the judge's verdict (``got``: output, duration and isolation)."""

    def res(passed: bool, reason: str) -> SandboxResult:
        return dataclasses.replace(got, passed=passed, reason=reason)

    if verdict is None:
        return res(False, f"timeout: wall-clock limit {timeout_s:g}s exceeded")
    if verdict.get("passed") is True:
        return res(True, "passed")
    if "error" in verdict:
        return res(False, f"sandbox: {verdict['error']}")
    why = str(verdict.get("why", ""))
    if why == "timeout":
        return res(False, f"timeout: wall-clock limit {timeout_s:g}s exceeded")
    if why == "ended":
        return res(False, ended_reason(status, got.stderr_tail))
    if why.startswith("exception: MemoryError"):
        return res(False, "memory: MemoryError (address-space limit)")
    return res(False, why if why.startswith("exception:") else f"exception: {why}")
