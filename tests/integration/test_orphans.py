"""A launch's grandchildren are waited for (components/runtime/orphans.py): on Ctrl-C the DeepSpeed runner
exited at once while its `launch.py` was still stopping the ranks (~2.8 s), so the CLI returned with
the training still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from components.runtime import orphans

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc") or sys.platform != "linux", reason="Linux /proc")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _launcher(grandchild_s: float) -> subprocess.Popen:
    """A child that starts a grandchild sleeping ``grandchild_s`` and exits at once, printing its pid."""
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep({grandchild_s})'], stdout=subprocess.DEVNULL); print(p.pid, flush=True)")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_grandchild_left_running_by_its_parent_is_waited_for() -> None:
    assert not orphans.is_subreaper()
    with orphans.reaping(30.0) as known:
        proc = _launcher(1.5)
        known.add(proc.pid)
        grandchild = int(proc.stdout.readline())
        assert proc.wait() == 0 and _alive(grandchild)  # the parent is gone, the grandchild runs on
        assert orphans.is_subreaper()
        start = time.monotonic()
    assert not _alive(grandchild), "returned while the grandchild still ran"
    assert 0.5 < time.monotonic() - start < 10
    assert not orphans.is_subreaper()  # later orphans go to init again


def test_one_still_running_at_the_deadline_is_killed() -> None:
    with orphans.reaping(0.5) as known:
        proc = _launcher(120)
        known.add(proc.pid)
        grandchild = int(proc.stdout.readline())
        proc.wait()
        start = time.monotonic()
    assert time.monotonic() - start < 10 and not _alive(grandchild)


def test_children_from_before_are_not_touched() -> None:
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = time.monotonic()
        with orphans.reaping(30.0):
            pass
        assert time.monotonic() - start < 5 and before.poll() is None
    finally:
        before.send_signal(signal.SIGKILL)
        before.wait()


def test_only_the_launchs_processes_are_waited_for_not_another_threads_child() -> None:
    """A child started meanwhile by another thread (no launch id in its environment) is left alone."""
    env, token = orphans.launch_env()
    start = time.monotonic()
    with orphans.reaping(0.5, token) as known:
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        launch = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"], env=env)
        known.add(launch.pid)
        launch.wait()
    try:
        assert other.poll() is None, "another thread's child was killed"
        assert time.monotonic() - start < 10
    finally:
        other.kill()
        other.wait()


def test_run_streaming_returns_only_after_an_interrupted_launchs_grandchildren() -> None:
    """The runner exits on SIGTERM at once; its child (the rank) needs 1.5 s to stop. Was: the interrupt
    unwound as soon as the runner was gone."""
    from components.runtime.launch import run_streaming

    code = ("import signal, subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), exit(0))); print(\"ready\", flush=True); "
            "time.sleep(60)'], stdout=subprocess.DEVNULL)\n"
            "signal.signal(signal.SIGTERM, lambda *a: (p.send_signal(signal.SIGTERM), sys.exit(143)))\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    pids: list[int] = []

    def on_line(line: str) -> bool:
        pids.append(int(line))
        time.sleep(0.5)  # the rank installs its handler
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_streaming([sys.executable, "-c", code], on_line=on_line)
    assert pids and not _alive(pids[0]), "the launch's child still ran when the interrupt unwound"
