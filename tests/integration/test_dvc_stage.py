"""The DVC-stage watcher (components/dvc_stage.py): it finds ``dvc`` among the ancestors, treats an
exited (zombie) process as gone, and starts nothing outside a stage. The end-to-end case (SIGTERM to
a real ``dvc repro``) is tests/integration/test_dvc_stage_interrupt.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from components import dvc_stage

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc only")


def test_an_exited_unreaped_process_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(100):  # not waited for: a zombie until reaped
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    assert dvc_stage._stat(child.pid) is None
    child.wait()
    assert dvc_stage._stat(child.pid) is None


def test_a_live_process_is_alive_only_with_its_own_start_time() -> None:
    parent, start = dvc_stage._stat(os.getpid())
    assert parent == os.getppid()
    assert dvc_stage._alive(os.getpid(), start)
    assert not dvc_stage._alive(os.getpid(), str(int(start) + 1))  # a later process given the same pid


def test_dvc_is_found_among_the_ancestors_through_a_shell(tmp_path) -> None:
    fake = tmp_path / "dvc"  # a process whose argv[1] is a `dvc` console script, as pip installs it
    fake.write_text("import subprocess, sys\n"
                    "subprocess.run(['/bin/sh', '-c', sys.argv[1] + '; true'])\n")
    probe = (f"{sys.executable} -c \"import os; from components.dvc_stage import find_dvc_ancestor as f; "
             f"print(f()[0], os.getppid())\"")
    proc = subprocess.Popen([sys.executable, str(fake), probe], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    found, shell = map(int, out.split())
    assert found == proc.pid  # the fake dvc, two generations up
    assert shell != proc.pid  # dash stays between (`; true` keeps any shell from exec-ing the command)


def test_outside_a_stage_nothing_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dvc_stage.DVC_STAGE_ENV, raising=False)
    assert dvc_stage.follow_dvc() is None
    monkeypatch.setenv(dvc_stage.DVC_STAGE_ENV, "train")  # set, but no dvc above pytest
    assert dvc_stage.find_dvc_ancestor() is None
    assert dvc_stage.follow_dvc() is None


def test_the_cli_follows_dvc_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from components import cli
    from components.config import ConfigError

    calls: list[str] = []
    monkeypatch.setattr(cli, "follow_dvc", lambda: calls.append("follow"))
    monkeypatch.setattr(cli, "load_config", lambda *a: (_ for _ in ()).throw(ConfigError("stop here")))
    assert cli.main(["validate"]) == 2
    assert calls == ["follow"]
