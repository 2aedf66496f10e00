"""`agent-gspo` commands as forks of one interpreter that has imported the CLI's heavy modules once.

A test that runs the CLI many times (each refusal of ``agent-gspo train`` is its own process) spends
~3 s of every run importing torch, transformers and MLflow before the command's first line. Run as a
script, this file is a fork server: it imports those modules, then for every command it is sent
forks, and the child runs ``components.cli`` as ``python -m components.cli`` would (``runpy``,
``__main__``, ``sys.argv``, the command's working folder and environment, its stdout and stderr in
files, stdin from /dev/null) and ends the way that process ends: ``sys.exit``'s code, an uncaught
exception's traceback on stderr and exit 1, or a signal. Each command is a fresh process (state
never carries from one command to the next), only the imports are done before it starts.

:class:`CliForks` is the test side: :meth:`CliForks.run` returns a ``subprocess.CompletedProcess``
like ``subprocess.run(..., capture_output=True, text=True)``; :meth:`CliForks.start` returns a
running command (its pid, for a signal) to :meth:`ForkedCommand.wait` for. One command at a time.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# what `python -m components.cli train` imports before and while it trains (tracking included)
PRELOAD = ("components.cli_parser", "components.jobs.train", "components.runtime.training_run",
           "components.runtime.run_tracking", "components.models", "mlflow")


def _child(case: dict) -> None:
    """In the forked child: become ``python -m components.cli ARGS`` (never returns)."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, case["stdout"], os.O_WRONLY | os.O_TRUNC),
                            (2, case["stderr"], os.O_WRONLY | os.O_TRUNC)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (nothing of the server's input buffered in it)
    os.chdir(case["cwd"])
    os.environ.clear()
    os.environ.update(case["env"])
    sys.argv = ["components.cli", *case["args"]]
    runpy.run_module("components.cli", run_name="__main__", alter_sys=True)
    sys.exit(0)  # cli.py's `if __name__ == "__main__"` exits itself; this only ends a module that did not


def serve() -> None:
    """Read one JSON command a line from stdin; answer ``{"pid": ...}`` at its start and ``{"rc": ...}`` at its end."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    sys.modules.pop("components.cli", None)  # run as __main__ below, as `python -m` does (runpy warns otherwise)
    # the imported objects out of the collector's reach: a child's collections and exit would otherwise
    # touch (copy on write) every page of them, ~0.7 s a command (Python's gc.freeze docs, fork servers)
    gc.freeze()
    answer = sys.stdout
    answer.write(json.dumps({"ready": os.getpid()}) + "\n")
    answer.flush()
    for line in sys.stdin.buffer:
        case = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(case)  # the child's SystemExit or exception ends it here, as a real start's would
        answer.write(json.dumps({"pid": pid}) + "\n")
        answer.flush()
        _, status = os.waitpid(pid, 0)
        answer.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        answer.flush()


class ForkedCommand:
    """One running command of :class:`CliForks` (its ``pid``); :meth:`wait` for its result."""

    def __init__(self, server: CliForks, case: dict, pid: int) -> None:
        self.server, self.case, self.pid = server, case, pid

    def send_signal(self, sig: int) -> None:
        """Signal it; nothing when it has ended already (as ``Popen.send_signal``)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def wait(self, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """Its exit code (``-N`` for signal N, as Popen says) and its stdout / stderr as text."""
        try:
            rc = self.server.answer(timeout)["rc"]
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.server.answer(60)
            raise
        finally:
            self.server.running = None
            out, err = (Path(self.case[k]).read_text(errors="replace") for k in ("stdout", "stderr"))
            for k in ("stdout", "stderr"):
                Path(self.case[k]).unlink(missing_ok=True)
        return subprocess.CompletedProcess(["agent-gspo", *self.case["args"]], rc, out, err)


class CliForks:
    """The fork server as a context manager (see the module docstring)."""

    def __init__(self, root: Path, env: dict[str, str] | None = None, timeout_s: float = 300.0) -> None:
        """``root``: the repository (the commands' default working folder); ``env``: their default environment."""
        self.cwd, self.env = Path(root), dict(os.environ if env is None else env)
        self.folder = Path(tempfile.mkdtemp(prefix="cli-forks-"))
        self.log = self.folder / "server.log"
        with self.log.open("w") as log:
            # unbuffered: a line read must never leave the next one in a buffer that select() cannot see
            self.proc = subprocess.Popen([sys.executable, __file__, str(self.cwd)], cwd=self.cwd, env=self.env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0)
        self.running: ForkedCommand | None = None
        self.n = 0
        self.answer(timeout_s)  # {"ready": pid}: the imports are done

    def answer(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not ready:
            raise subprocess.TimeoutExpired("cli fork server", timeout)
        if not line:
            raise RuntimeError(f"the cli fork server died ({self.proc.wait()}):\n{self.log.read_text()[-3000:]}")
        return json.loads(line)

    def start(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> ForkedCommand:
        """Start ``agent-gspo ARGS`` (``env``: the whole environment, default the server's; ``cwd``: its folder)."""
        assert self.proc.stdin is not None and self.running is None, "one command at a time"
        self.n += 1
        case = {"args": [str(a) for a in args], "env": self.env if env is None else dict(env),
                "cwd": str(cwd or self.cwd), "stdout": str(self.folder / f"{self.n}.out"),
                "stderr": str(self.folder / f"{self.n}.err")}
        for k in ("stdout", "stderr"):
            Path(case[k]).touch()
        self.proc.stdin.write((json.dumps(case) + "\n").encode())
        self.running = ForkedCommand(self, case, self.answer(60)["pid"])
        return self.running

    def run(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 600.0) -> subprocess.CompletedProcess:
        """``agent-gspo ARGS`` to its end, like ``subprocess.run(..., capture_output=True, text=True)``."""
        return self.start(*args, env=env, cwd=cwd).wait(timeout)

    def close(self) -> None:
        """End the server (and a command still running: a test that failed while it ran)."""
        if self.running is not None:
            self.running.send_signal(signal.SIGKILL)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        for path in self.folder.iterdir():
            path.unlink()
        self.folder.rmdir()

    def __enter__(self) -> CliForks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.path[0] = sys.argv[1]  # the repository root, where `python -m` in it would import from (not this folder)
    serve()
