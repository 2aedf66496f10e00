"""Process and file helpers of the code sandbox's host side (kill, scan, read, clean up)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import time
from pathlib import Path

TAIL = 2000


def uid_procs(uid: int) -> list[int]:
    """Live (non-zombie) PIDs whose real uid is ``uid`` (a racy /proc scan, so callers loop)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                        break
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


def kill_all(pgid: int, uid: int | None) -> None:
    """SIGKILL the process group (with namespaces: init, hence the whole PID namespace) and, in
    unsafe mode with a private uid, every process of that uid."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(50 if uid is not None else 0):
        pids = uid_procs(uid)  # type: ignore[arg-type]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - TAIL))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_all(fd: int, deadline: float) -> bytes:
    """Everything written to ``fd`` until EOF or ``deadline``."""
    out = b""
    while (left := deadline - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out


def remove_uid_files(uid: int) -> None:
    """Unsafe mode: delete what the private uid left in the world-writable temp folders (top level)."""
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
