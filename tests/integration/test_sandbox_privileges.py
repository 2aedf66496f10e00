"""The sandbox isolates or refuses -- as root, as an unprivileged user, as root without
CAP_SYS_ADMIN and under a seccomp profile that forbids namespaces -- and never runs code unisolated
unless the unsafe opt-out is set. Each case runs ``sandbox_probe.py`` in a child process that
lowers its own privileges first (see that file for the attacks)."""
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest
from helpers.paths import REPO_ROOT, find_under_tests

from components.scoring.sandbox import UNSAFE_ENV

ROOT = os.geteuid() == 0
PROBE = find_under_tests("sandbox_probe.py")
REPO = REPO_ROOT
X86 = platform.machine() == "x86_64"


def _probe(scenario: str, unsafe: bool = False) -> tuple[dict, bool]:
    """(probe output, whether the TCP listener was reached)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    # outside the sandbox's fresh tmpfs folders (/tmp, /var/tmp, /dev/shm, /run): the files there
    # are protected by the read-only mounts alone
    outside = tempfile.mkdtemp(prefix=".sandbox-probe-", dir=REPO)
    os.chmod(outside, 0o1777)
    env = {k: v for k, v in os.environ.items() if k != UNSAFE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if unsafe:
        env[UNSAFE_ENV] = "1"
    try:
        proc = subprocess.run([sys.executable, str(PROBE), scenario, str(server.getsockname()[1]), outside],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        try:
            server.accept()
            reached = True
        except TimeoutError:
            reached = False
        return json.loads(proc.stdout.strip().splitlines()[-1]), reached
    finally:
        server.close()
        shutil.rmtree(outside, ignore_errors=True)


def _assert_isolated_or_refused(out: dict, reached: bool) -> None:
    if out.get("skip"):
        pytest.skip(out["skip"])
    assert not reached, "a sandboxed program reached a TCP listener on the host"
    assert not out["unix_accepted"], "a sandboxed program reached a unix socket of the scorer"
    assert out["canary"] == "intact" and not out["canary_new"], "a file outside the sandbox was changed"
    assert not out["tmp_marker"], "the program wrote into the host's /tmp or /dev/shm"
    assert not out["daemons"], f"processes left by the program survived: {out['daemons']}"
    if "refused" in out:
        assert "run" not in out, "refused, yet a program ran"
        msg = out["refused"]
        assert "unshare" in msg or "namespace" in msg, msg
        assert UNSAFE_ENV in msg and "seccomp" in msg, "the refusal must say how to enable or opt out"
        return
    run = out["run"]
    assert out["mode"] in ("root", "userns") and run["isolation"] == out["mode"], out
    assert run["passed"], run
    seen = run["stdout"]
    assert "connected" not in seen, seen
    assert out["secret"] not in seen, "another process's environment was readable"
    assert out["gold"] not in seen and "'gold': \"FileNotFoundError" in seen, "a hidden gold file was readable"
    assert "'fork': \"PermissionError" in seen, "a sandboxed program started a new process"
    assert out["wrong_task"] is False and out["right_task"] is True


needs_root = pytest.mark.skipif(not ROOT, reason="lowering privileges needs root")
needs_x86 = pytest.mark.skipif(not X86, reason="the probe's seccomp filter is written for x86_64")


def test_as_is() -> None:
    out, reached = _probe("as-is")
    _assert_isolated_or_refused(out, reached)
    if ROOT:
        assert out.get("mode") == "root", "root with CAP_SYS_ADMIN must get the full sandbox"


@needs_root
def test_unprivileged_user() -> None:
    out, reached = _probe("nobody")
    _assert_isolated_or_refused(out, reached)


@needs_root
def test_root_without_cap_sys_admin() -> None:
    out, reached = _probe("no-sys-admin")
    _assert_isolated_or_refused(out, reached)


@needs_x86
@pytest.mark.parametrize("scenario", ["seccomp", "nobody-seccomp"] if ROOT else ["seccomp"])
def test_no_namespaces_means_refusal(scenario: str) -> None:
    out, reached = _probe(scenario)
    _assert_isolated_or_refused(out, reached)
    assert "refused" in out, "without namespaces the sandbox must refuse"


@needs_x86
def test_unsafe_opt_out_runs_but_still_judges_outside_the_program() -> None:
    out, _ = _probe("seccomp", unsafe=True)
    assert out["mode"] == "unsafe" and out["run"]["isolation"] == "unsafe"
    assert out["wrong_task"] is False and out["right_task"] is True
