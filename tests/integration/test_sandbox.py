"""Adversarial programs: each must fail with a reason while the scorer and its files survive."""
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from helpers import grade_rows
from helpers.paths import REPO_ROOT

from components.scoring.code import score_code, score_code_many
from components.scoring.sandbox import (
    CodeTask,
    SandboxError,
    SandboxLimits,
    humaneval_program,
    run_many,
    run_program,
    run_task,
    sandbox_mode,
)

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
META = {"prompt": PROMPT, "test": TEST, "entry_point": "add"}


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return any(line.startswith("State:") and line.split()[1] in ("Z", "X") for line in fh)
    except FileNotFoundError:
        return True


def test_the_sandbox_is_isolated_here() -> None:
    """CI's machine must give the real sandbox (an unsafe fallback is only ever an explicit opt-out)."""
    assert sandbox_mode() in ("root", "userns")
    res = run_program("print('ok')\n", timeout_s=5)
    assert res.passed and res.isolation in ("root", "userns")


def test_correct_program_passes_and_reports_output() -> None:
    res = run_program("import math\nprint(math.factorial(5))\n", timeout_s=5)
    assert res.passed and res.reason == "passed"
    assert res.stdout_tail.strip() == "120"
    assert res.duration_s < 5


def test_humaneval_pass_and_fail() -> None:
    assert score_code("    return a + b\n", META).correct
    bad = score_code("    return a - b\n", META)
    assert not bad.correct and bad.extracted.startswith("exception: AssertionError")
    fenced = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    assert score_code(fenced, META).correct


def test_infinite_loop_times_out() -> None:
    t0 = time.monotonic()
    res = run_program("while True:\n    pass\n", timeout_s=1.5)
    assert not res.passed and res.reason.startswith("timeout")
    assert time.monotonic() - t0 < 4
    t0 = time.monotonic()
    res = run_task(CodeTask(PROMPT, "    while True: pass\n", TEST, "add"), timeout_s=1.5)
    assert not res.passed and res.reason.startswith("timeout"), res
    assert time.monotonic() - t0 < 5


def test_cpu_limit_and_other_failures() -> None:
    res = run_program("while True:\n    pass\n", timeout_s=5, limits=SandboxLimits(cpu_s=1))
    assert not res.passed and res.reason.startswith("cpu-limit"), res
    res = run_program("def f(:\n", timeout_s=5)
    assert not res.passed and res.reason.startswith("exception: SyntaxError"), res
    res = run_program("def f(n):\n    return f(n + 1)\nf(0)\n", timeout_s=5)
    assert not res.passed and res.reason.startswith("exception: RecursionError"), res
    res = run_program("import sys\nsys.exit(3)\n", timeout_s=5)
    assert not res.passed and res.reason.startswith("early-exit: exit status 3"), res


def test_exit_before_check_fails() -> None:
    for completion in ("    return a + b\nimport sys\nsys.exit(0)\n", "    return a + b\nimport os\nos._exit(0)\n"):
        res = score_code(completion, META)
        assert not res.correct and res.extracted.startswith("early-exit"), res


def test_memory_bomb_fails() -> None:
    res = run_program("x = bytearray(8 * 1024**3)\n", timeout_s=5, limits=SandboxLimits(memory_mb=512))
    assert not res.passed and res.reason.startswith("memory")
    src = "x = []\nwhile True:\n    x.append(' ' * 10**6)\n"
    res = run_program(src, timeout_s=5, limits=SandboxLimits(memory_mb=256))
    assert not res.passed and res.reason.startswith("memory"), res


def test_fork_bomb_is_contained() -> None:
    src = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    res = run_program(src, timeout_s=1.5, limits=SandboxLimits(max_procs=16))
    assert not res.passed and res.reason.startswith("timeout")
    assert run_program("print('ok')", timeout_s=5).passed  # the machine still works


@pytest.mark.parametrize("src", [
    "import os\nos.fork()\n",
    "import subprocess\nsubprocess.run(['/bin/true'])\n",
    "import os\nos.posix_spawn('/bin/true', ['true'], {})\n",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
])
def test_new_processes_are_refused_with_a_clear_reason(src: str) -> None:
    """No process besides the program's own (seccomp): a clear failure, never a hang."""
    res = run_program(src, timeout_s=10)
    assert not res.passed and res.reason.startswith("exception: PermissionError"), res
    assert "refused by the sandbox: a new process" in res.reason, res
    assert res.duration_s < 9


def test_threads_still_work() -> None:
    src = ("import threading\nout = []\nts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
           "[t.start() for t in ts]\n[t.join() for t in ts]\nassert sorted(out) == list(range(8))\n"
           "from concurrent.futures import ThreadPoolExecutor\n"
           "assert list(ThreadPoolExecutor(4).map(abs, [-1, -2])) == [1, 2]\n")
    res = run_program(src, timeout_s=10)
    assert res.passed, res


def test_killing_the_parent_fails() -> None:
    """The program's parent is the namespace's init: it cannot be signalled; the scorer is not visible."""
    src = ("import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
           "    except OSError:\n        pass\nprint('alive', os.getppid())\n")
    res = run_program(src, timeout_s=5)
    assert res.passed and res.stdout_tail.strip() == "alive 1", res
    res = run_program(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\n", timeout_s=5)
    assert not res.passed and res.reason.startswith("exception: ProcessLookupError"), res


def test_canary_file_outside_tempdir_survives(tmp_path: Path) -> None:
    """A file of the scorer's own user, readable and writable to it, in a folder it may write: the
    checkout is not even visible; folders that are (Python's library, /etc) are read-only."""
    outside = REPO_ROOT / f".sandbox-canary-{os.getpid()}"
    outside.mkdir()
    try:
        canary = outside / "canary.txt"
        canary.write_text("intact")
        src = (f"import os\np = {str(canary)!r}\nfor act in (lambda: os.remove(p), lambda: open(p, 'w')):\n"
               "    try:\n        act()\n    except OSError as e:\n        print(type(e).__name__)\n"
               "open(p + '.new', 'w').write('pwned')\n")
        res = run_program(src, timeout_s=5)
        assert not res.passed and "FileNotFoundError" in res.reason, res
        assert canary.read_text() == "intact" and sorted(os.listdir(outside)) == ["canary.txt"]
        for folder in (os.path.dirname(os.__file__), "/etc"):
            target = os.path.join(folder, f".sandbox-canary-{os.getpid()}")
            res = run_program(f"open({target!r}, 'w').write('pwned')\n", timeout_s=5)
            assert not res.passed and ("PermissionError" in res.reason or "Read-only" in res.reason), res
            assert not os.path.exists(target)
    finally:
        for p in outside.iterdir():
            p.unlink()
        outside.rmdir()


def test_cwd_is_fresh_and_private() -> None:
    marker = f"agent-gspo-cwd-{os.getpid()}.txt"
    res = run_program(f"import os\nprint(os.getcwd())\nprint(os.listdir('.'))\nopen({marker!r},'w').write('x')\n",
                      timeout_s=5)
    assert res.passed
    cwd, listing = res.stdout_tail.splitlines()[:2]
    assert listing == "[]"
    assert not (Path(cwd) / marker).exists()  # it lived in the sandbox's own tmpfs


def test_parent_environment_is_invisible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GSPO_SECRET", "hunter2-secret")
    src = ("import os\nprint(sorted(os.environ))\n"
           "print(open(f'/proc/{os.getppid()}/environ', 'rb').read())\n"
           "for p in os.listdir('/proc'):\n    try:\n        print(open(f'/proc/{p}/environ', 'rb').read())\n"
           "    except OSError:\n        pass\n")
    res = run_program(src, timeout_s=5)
    assert "hunter2-secret" not in res.stdout_tail + res.stderr_tail
    assert "AGENT_GSPO_SECRET" not in res.stdout_tail
    res = run_program("import os\nassert os.environ['AGENT_GSPO_SECRET']\n", timeout_s=5)
    assert not res.passed and "KeyError" in res.reason


def test_the_hidden_paths_are_not_listed_in_any_command_line(tmp_path: Path) -> None:
    """The boot process's argv used to carry its config, readable in /proc/1/cmdline inside the
    sandbox: the list of host folders it hides (the checkout, the data, ...)."""
    from components.scoring.sandbox import hide_paths

    secret = tmp_path / "gold-answers-here"
    secret.mkdir()
    hide_paths(secret)
    src = ("import os\nfor p in os.listdir('/proc'):\n    try:\n"
           "        print(open(f'/proc/{p}/cmdline', 'rb').read())\n    except OSError:\n        pass\n")
    res = run_program(src, timeout_s=5)
    assert res.passed and "cmdline" not in res.stderr_tail, res.reason
    assert "gold-answers-here" not in res.stdout_tail and '"hide"' not in res.stdout_tail


def test_sockets_are_blocked() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        for src in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
                    f"import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"):
            res = run_program(src, timeout_s=5)
            assert not res.passed and res.reason.startswith("exception"), res
        with pytest.raises(TimeoutError):
            server.accept()  # nothing got through
    finally:
        server.close()


def test_file_size_and_output_flood_are_bounded() -> None:
    res = run_program("open('big', 'wb').write(b'x' * (64 << 20))\n", timeout_s=5, limits=SandboxLimits(max_file_mb=8))
    assert not res.passed and ("File too large" in res.reason or "file-size-limit" in res.reason), res
    res = run_program("while True:\n    print('y' * 4096)\n", timeout_s=5, limits=SandboxLimits(max_file_mb=4))
    assert not res.passed and len(res.stdout_tail) <= 2000


def test_escaped_daemon_is_killed() -> None:
    """A daemon cannot even start (no new process); were one to, the PID namespace's end kills it."""
    marker = f"{os.getpid()}.{time.monotonic_ns() % 997 + 1}"
    src = (f"import os\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', "
           f"'{marker}'])\nprint(pid, flush=True)\n")
    res = run_program(src, timeout_s=5)
    assert not res.passed and res.reason.startswith("exception: PermissionError"), res
    time.sleep(0.1)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert marker.encode() not in cmdline or _gone(int(pid)), f"daemon {pid} survived"


def test_run_many_parallel_and_ordered() -> None:
    programs = ["import time\ntime.sleep(0.5)\n", "assert False, 'boom'\n", "while True: pass\n", "print(1)\n"]
    t0 = time.monotonic()
    results = run_many(programs, timeout_s=4, workers=4)  # room for a loaded machine to start them
    assert [r.passed for r in results] == [True, False, False, True], results
    assert "boom" in results[1].reason and results[2].reason.startswith("timeout")
    assert time.monotonic() - t0 < 4 * 4  # not strictly sequential worst case


def test_score_code_many_mixed() -> None:
    results = score_code_many(["    return a + b\n", "    while True: pass\n", "    return a * b\n"], [META] * 3,
                              timeout_s=2)
    assert [r.correct for r in results] == [True, False, False]
    assert results[1].extracted.startswith("timeout")


def test_grading_code_mixed_with_other_types() -> None:
    items = [("code", "    return a + b\n", "", META), ("numeric", "#### 5", "5", {}),
             ("code", "    while True: pass\n", "", META), ("choice", "(B)", "B", {})]
    results = grade_rows(items, timeout_s=2)
    assert [r.correct for r in results] == [True, True, False, True]
    assert results[2].extracted.startswith("timeout")


def test_program_builder_and_bad_limits() -> None:
    assert humaneval_program("P", "C", "T", "f").endswith("P" + "C" + "\nT\ncheck(f)\n")
    with pytest.raises(SandboxError):
        run_program("print(1)", timeout_s=0)
    for bad in ({"memory_mb": 0}, {"max_procs": -1}, {"max_file_mb": 0}, {"cpu_s": 0}):
        with pytest.raises(SandboxError, match="positive"):
            SandboxLimits(**bad)
    broken = run_program("print(1)", timeout_s=5, python="/nonexistent/python")
    assert not broken.passed and broken.reason.startswith("sandbox:")
    assert sys.executable  # the scorer is alive and well
