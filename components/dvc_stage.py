"""A DVC stage ends with the ``dvc`` that runs it.

``dvc repro`` runs a stage's ``cmd`` as ``$SHELL -c "<cmd>"`` and, on SIGTERM (or SIGKILL), dies
without passing the signal on: the stage (hours of training, a Prefect-free evaluation) ran on as
an orphan, writing outputs no lock file guards any more. When ``DVC_STAGE`` is in the environment
(DVC sets it for every stage command), :func:`follow_dvc` finds the ``dvc`` process among this
process's nearest ancestors and watches it from a daemon thread; once it is gone, this process
sends itself SIGTERM, so it unwinds exactly as a ``kill`` would (``finally`` blocks, MLflow run
ended KILLED, launched ranks stopped, one ``interrupted (SIGTERM)`` line, exit 143).

Polled from ``/proc`` rather than ``prctl(PR_SET_PDEATHSIG)``: the death signal fires on the
*parent's* exit only, and between ``dvc`` and this process there may be a shell that outlives it
(dash, unlike bash, does not ``exec`` the last command). Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

DVC_STAGE_ENV = "DVC_STAGE"
POLL_S = 1.0
ANCESTORS = 4
"""how far up the process tree ``dvc`` is looked for (dvc -> shell -> this, plus a wrapper)"""
log = logging.getLogger(__name__)


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks) of ``pid`` from ``/proc/<pid>/stat``; None if it is
    gone or has exited (a zombie: ``dvc`` run by a program that has not reaped it yet).

    The start time tells a process from a later one given the same pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": the comm may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[19]


def _is_dvc(pid: int) -> bool:
    """Whether ``pid`` runs DVC's CLI: ``dvc ...`` (console script, argv[0] or argv[1] after an
    interpreter) or ``python -m dvc ...``."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return False
    head = argv[:3]
    return any(os.path.basename(a) == "dvc" for a in head[:2]) or head[1:3] == ["-m", "dvc"]


def find_dvc_ancestor(pid: int | None = None, depth: int = ANCESTORS) -> tuple[int, str] | None:
    """(pid, start time) of the nearest ``dvc`` ancestor of ``pid`` (default: this process) within
    ``depth`` generations, or None."""
    current = os.getpid() if pid is None else pid
    for _ in range(depth):
        stat = _stat(current)
        if stat is None or stat[0] <= 1:
            return None
        current = stat[0]
        if _is_dvc(current):
            parent = _stat(current)
            return None if parent is None else (current, parent[1])
    return None


def _alive(pid: int, start: str) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] == start


def follow_dvc(poll_s: float = POLL_S) -> threading.Thread | None:
    """Under a DVC stage, start the watcher thread (returned); otherwise (or off Linux) None."""
    if not os.environ.get(DVC_STAGE_ENV) or not Path("/proc/self/stat").exists():
        return None
    found = find_dvc_ancestor()
    if found is None:
        return None
    pid, start = found

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if not _alive(pid, start):
                log.warning("dvc (pid %d), which runs stage %r, is gone: stopping", pid,
                            os.environ.get(DVC_STAGE_ENV))
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="follow-dvc", daemon=True)
    thread.start()
    return thread
