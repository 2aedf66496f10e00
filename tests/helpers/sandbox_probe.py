"""Attack the code sandbox from a process with fewer privileges; print what got through as JSON.

Run by ``tests/integration/test_sandbox_privileges.py`` as ``python sandbox_probe.py SCENARIO PORT``:

* ``as-is``: the current user (root on CI's machine: namespaces + private uid);
* ``nobody``: a root process switches to uid/gid 65534 first (the images' non-root case);
* ``no-sys-admin``: root without CAP_SYS_ADMIN (what a default container gives);
* ``seccomp``, ``nobody-seccomp``: a seccomp filter that, like Docker's default profile, makes
  ``unshare`` and namespace flags of ``clone`` fail with EPERM (and ``clone3`` with ENOSYS),
  so no namespace can be made: the sandbox must refuse.

The scenario is applied after the project is imported (the interpreter may live where the
lowered user cannot read). Then, unless the sandbox refuses, adversarial programs try to reach
a TCP listener of the caller on 127.0.0.1:PORT, read a secret from another process's environ
and a world-readable gold-answer file of the scorer, overwrite and delete a file of the scorer's
user outside the sandbox, leave a daemon running and reach a unix socket of the scorer. The
output says what they achieved.
"""

import ctypes
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from components.scoring import sandbox
from components.scoring.sandbox import CodeTask, SandboxUnavailable, run_program, run_task

NOBODY = 65534
CAP_SYS_ADMIN = 21
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 24, 38, 22, 2
_LIBC = ctypes.CDLL(None, use_errno=True)


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def deny_namespaces() -> None:
    """x86_64 seccomp filter: unshare -> EPERM, clone with CLONE_NEW* -> EPERM, clone3 -> ENOSYS."""
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    new_flags = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
    prog = [
        (ld, 0, 0, 4), (jeq, 1, 0, 0xC000003E), (ret, 0, 0, allow),  # other architectures: allow
        (ld, 0, 0, 0),
        (jeq, 0, 1, 272), (ret, 0, 0, eperm),  # unshare
        (jeq, 0, 1, 435), (ret, 0, 0, enosys),  # clone3: glibc falls back to clone
        (jeq, 0, 3, 56), (ld, 0, 0, 16), (jset, 0, 1, new_flags), (ret, 0, 0, eperm),  # clone(flags)
        (ret, 0, 0, allow),
    ]
    arr = (_Filter * len(prog))(*[_Filter(*f) for f in prog])
    fprog = _Prog(len(prog), arr)
    if _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or _LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                                                                     ctypes.byref(fprog), 0, 0):
        raise OSError(ctypes.get_errno(), "installing the seccomp filter failed")


def drop_sys_admin() -> None:
    class Head(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    head, data = Head(0x20080522, 0), (Data * 2)()
    if _LIBC.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) or _LIBC.capget(ctypes.byref(head), data):
        raise OSError(ctypes.get_errno(), "dropping CAP_SYS_ADMIN failed")
    for d in data[:1]:
        d.effective &= ~(1 << CAP_SYS_ADMIN)
        d.permitted &= ~(1 << CAP_SYS_ADMIN)
        d.inheritable &= ~(1 << CAP_SYS_ADMIN)
    if _LIBC.capset(ctypes.byref(head), data):
        raise OSError(ctypes.get_errno(), "capset failed")


def become_nobody() -> None:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    os.environ["HOME"] = "/"
    if not os.access(sys.executable, os.X_OK):  # e.g. pyenv under /root (0700): use the system one
        sys.executable = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def attack_program(port: int, victim_pid: int, canary: str, sock_path: str, marker: str, sleep_arg: str,
                   gold: str) -> str:
    """What the untrusted program tries; prints a dict of outcomes."""
    return f"""
import os, socket, _socket, subprocess, sys
out = {{}}
try:
    out["gold"] = open({gold!r}).read()
except OSError as e:
    out["gold"] = repr(e)
try:
    s = _socket.socket(); s.settimeout(2); s.connect(("127.0.0.1", {port})); out["tcp"] = "connected"
except OSError as e:
    out["tcp"] = repr(e)
try:
    u = socket.socket(socket.AF_UNIX); u.settimeout(2); u.connect({sock_path!r}); out["unix"] = "connected"
except OSError as e:
    out["unix"] = repr(e)
found = []
for pid in os.listdir("/proc"):
    try:
        found.append(open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace"))
    except OSError:
        pass
try:
    found.append(open("/proc/{victim_pid}/environ", "rb").read().decode(errors="replace"))
except OSError as e:
    out["victim"] = repr(e)
out["environ"] = found
for what, act in (("overwrite", lambda: open({canary!r}, "w").write("pwned")),
                  ("delete", lambda: os.remove({canary!r})),
                  ("create", lambda: open({canary!r} + ".new", "w").write("x")),
                  ("tmp", lambda: open("/tmp/{marker}", "w").write("x")),
                  ("devshm", lambda: open("/dev/shm/{marker}", "w").write("x"))):
    try:
        act(); out[what] = "done"
    except OSError as e:
        out[what] = repr(e)
try:
    pid = os.fork()  # refused in the sandbox (seccomp); the unsafe opt-out allows it
except OSError as e:
    pid, out["fork"] = None, repr(e)
if pid == 0:
    os.setsid()
    os.execv("/bin/sleep", ["sleep", "{sleep_arg}"])
out["uid"] = os.getuid()
print(repr(out))
"""


def main() -> None:
    scenario, port, outside = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sock_path = os.path.join(outside, "scorer.sock")
    if scenario in ("no-sys-admin",):
        drop_sys_admin()
    if scenario.startswith("nobody"):
        become_nobody()
    if scenario.endswith("seccomp"):
        if platform.machine() != "x86_64":
            print(json.dumps({"skip": "the seccomp filter is written for x86_64"}))
            return
        deny_namespaces()
    marker = "agent-gspo-probe-" + secrets.token_hex(6)
    sleep_arg = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(999) + 1}"
    home = tempfile.mkdtemp(prefix="agent-gspo-probe-", dir=outside)  # outside the sandbox's fresh tmpfs
    canary = os.path.join(home, "canary.txt")
    with open(canary, "w") as fh:
        fh.write("intact")
    os.chmod(home, 0o755)
    gold = os.path.join(home, "HumanEval.jsonl")  # world-readable gold answers: must stay unread
    result_gold = "gold-answer-" + secrets.token_hex(8)
    with open(gold, "w") as fh:
        fh.write(result_gold)
    os.chmod(gold, 0o644)
    secret = "probe-secret-" + secrets.token_hex(8)
    victim = subprocess.Popen(["/bin/sleep", "60"], env={"AGENT_GSPO_PROBE_SECRET": secret})
    result: dict = {"scenario": scenario, "uid": os.getuid(), "secret": secret, "gold": result_gold}
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sock_path)
    listener.listen(1)
    listener.settimeout(0.1)
    try:
        try:
            result["mode"] = sandbox.sandbox_mode()
        except SandboxUnavailable as exc:
            result["refused"] = str(exc)
        attack = attack_program(port, victim.pid, canary, sock_path, marker, sleep_arg, gold)
        try:
            res = run_program(attack, timeout_s=10)
            result["run"] = {"passed": res.passed, "reason": res.reason, "stdout": res.stdout_tail,
                             "stderr": res.stderr_tail[-800:], "isolation": res.isolation}
        except SandboxUnavailable as exc:
            result["run_refused"] = str(exc)
        time.sleep(0.2)
        daemons = []
        for pid in os.listdir("/proc"):
            try:
                if sleep_arg in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                    daemons.append(int(pid))
            except OSError:
                pass
        result["daemons"] = daemons
        try:
            listener.accept()
            result["unix_accepted"] = True
        except TimeoutError:
            result["unix_accepted"] = False
        result["canary"] = open(canary).read() if os.path.exists(canary) else None
        result["canary_new"] = os.path.exists(canary + ".new")
        result["tmp_marker"] = os.path.exists(f"/tmp/{marker}") or os.path.exists(f"/dev/shm/{marker}")
        if "mode" in result:
            task = CodeTask('def add(a, b):\n    """a + b"""\n', "    return a - b\n",
                            "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add")
            result["wrong_task"] = run_task(task, timeout_s=10).passed
            right = CodeTask(task.prompt, "    return a + b\n", task.test, "add")
            result["right_task"] = run_task(right, timeout_s=10).passed
    finally:
        for pid in result.get("daemons", []):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        listener.close()
        os.unlink(sock_path)
        victim.kill()
        victim.wait()
        shutil.rmtree(home, ignore_errors=True)
        for path in (f"/tmp/{marker}", f"/dev/shm/{marker}"):
            if os.path.exists(path):
                os.remove(path)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
