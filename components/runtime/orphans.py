"""A launched training's grandchildren are waited for too, not only the launcher we started.

``deepspeed`` (the runner we start) starts ``deepspeed.launcher.launch``, which starts the ranks.
On Ctrl-C the runner exits at once while ``launch.py`` is still stopping its ranks (measured: it
outlived the CLI by ~2.8 s), so "the command has exited" did not mean "the training has stopped":
a ``--resume`` typed right away could race the old ranks for the run folder. Once the runner is
gone its children are orphans, reparented to init and out of our sight.

Linux has the tool for this: a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``) gets its
orphaned descendants reparented to itself instead of init. :func:`reaping` turns it on for the
launch only; :func:`wait_for_orphans` then waits for (and reaps) every process reparented to us,
killing what is left at the deadline. Processes that were already our children before the launch
are not touched. Elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
POLL_S = 0.05


def _prctl(option: int, value: int) -> int | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0))
    except (OSError, AttributeError):
        return None


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag.value)
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def reaping(timeout_s: float, token: str | None = None) -> Iterator[set[int]]:
    """While inside, this process is the subreaper of its orphaned descendants (Linux); on the way out
    (normal or not) every child that was not ours before, is not in the yielded set (add the pids of
    the children you wait for yourself) and carries launch id ``token`` (any, without one) is waited
    for (:func:`wait_for_orphans`), and the subreaper flag is put back as it was, so that later
    orphans go to init again."""
    known = children()
    was = is_subreaper()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield known
    finally:
        try:
            wait_for_orphans(known, timeout_s, token)
        finally:
            if not was:
                _prctl(PR_SET_CHILD_SUBREAPER, 0)


LAUNCH_ENV = "AGENT_GSPO_LAUNCH_ID"
"""set in a launch's environment (:func:`launch_env`): its processes inherit it, so a child of ours
that carries this launch's id is the launch's, and any other (started meanwhile by another thread)
is never waited for or killed"""


def launch_env(env: Mapping[str, str] | None = None) -> tuple[dict[str, str], str]:
    """(``env``, or ours, plus a fresh :data:`LAUNCH_ENV`; the id)."""
    token = uuid.uuid4().hex
    return {**(os.environ if env is None else env), LAUNCH_ENV: token}, token


def _carries(pid: int, token: str) -> bool:
    """Whether ``pid``'s environment holds this launch's id (a zombie's is empty: it has exited)."""
    try:
        return f"{LAUNCH_ENV}={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _exited(pid: int) -> bool:
    """A zombie (its environment is gone with it): reaping it is all that is left to do."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] in ("Z", "X")


def children() -> set[int]:
    """Pids whose parent is this process, zombies included (from ``/proc``; empty off Linux)."""
    me, out = os.getpid(), set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                text = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            if int(text[text.rindex(")") + 2:].split()[1]) == me:  # after "pid (comm) state": ppid
                out.add(int(entry.name))
    return out


def wait_for_orphans(known: set[int], timeout_s: float, token: str | None = None) -> list[int]:
    """Wait until every child of ours not in ``known`` (and, with ``token``, carrying that launch id
    when first seen) has exited, reaping each; SIGKILL those left after ``timeout_s``. Returns the
    pids that had to be killed."""
    deadline = time.monotonic() + timeout_s
    killed: list[int] = []
    ours: set[int] = set()
    while True:
        fresh = children() - known - ours
        ours |= {pid for pid in fresh if token is None or _carries(pid, token) or _exited(pid)}
        left = ours & children()
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            left.discard(pid)
            ours.discard(pid)
        if not left:
            return killed
        if time.monotonic() >= deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, ChildProcessError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    killed.append(pid)
            return killed
        time.sleep(POLL_S)
