"""Atomic writes name the path the user asked for when the file system refuses them."""

from __future__ import annotations

import errno
import tempfile

import pytest

from components.errors import run_command
from components.io import atomic_dir, write_text_atomic


def _refuse(*args, dir=None, prefix="", suffix="", **kwargs):  # noqa: A002 - mirrors tempfile's keyword
    raise OSError(errno.EROFS, "Read-only file system", f"{dir}/{prefix}abc123{suffix}")


@pytest.mark.parametrize("maker", ["mkstemp", "mkdtemp"])
def test_a_read_only_file_system_names_the_target_not_the_temporary_name(tmp_path, monkeypatch, capsys,
                                                                        maker) -> None:
    monkeypatch.setattr(tempfile, maker, _refuse)
    target = tmp_path / "report.md"

    def write() -> int:
        if maker == "mkstemp":
            write_text_atomic(target, "x")
        else:
            with atomic_dir(target):
                pass
        return 0

    assert run_command("agent-gspo report", write) == 2
    err = capsys.readouterr().err
    assert err == f"agent-gspo report: error: Read-only file system: {target}\n"
    assert ".tmp" not in err and "staging" not in err and not target.exists()


def test_a_successful_write_leaves_only_the_target(tmp_path) -> None:
    write_text_atomic(tmp_path / "a.txt", "hello")
    with atomic_dir(tmp_path / "d") as staging:
        (staging / "f").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "d"]
    assert (tmp_path / "a.txt").read_text() == "hello" and (tmp_path / "d" / "f").read_text() == "x"
