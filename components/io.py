"""Atomic file and folder writes: a failed run never leaves a half-written output.

A process killed in the middle (SIGKILL, power loss) can still leave the temporary names below
beside the target; :func:`recover_leftovers`, called while holding the target's
:func:`file_lock`, removes them (or finishes an interrupted swap) before the next write.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.errors import UserError


def _umask_mode(base: int) -> int:
    """``base`` filtered by the process umask (mkstemp/mkdtemp would leave 0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


@contextlib.contextmanager
def _naming(target: Path) -> Iterator[None]:
    """An OSError creating the temporary name (read-only file system, full disk, no permission)
    names ``target``: the user asked for that path and never sees the temporary one."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(target)) from None


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` only on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _naming(target):
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix + ".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():
            os.chmod(tmp_path, _umask_mode(0o666))
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_json_atomic(target: str | os.PathLike[str], obj: Any) -> None:
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh staging folder; on success swap it in for ``target`` (old one removed).

    The swap is two renames (old -> backup, staging -> target), so a crash between them leaves
    the previous contents in ``<target>.old-*``, never a mix of old and new files. A ``target``
    that is a symlink is replaced by the new folder; the link is removed, what it points to is
    never touched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _naming(target):
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".staging", dir=target.parent))
    try:
        yield staging
        os.chmod(staging, _umask_mode(0o777))
        backup = None
        if target.exists():
            backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            backup.rmdir()
            os.replace(target, backup)
        os.replace(staging, target)
        if backup is not None:
            _remove(backup)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], timeout_s: float = 600.0) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) across processes and threads.

    ``filelock`` (``flock``): released by the kernel when the holder dies, so a killed run never
    leaves a stale lock. Waiting longer than ``timeout_s`` raises :class:`UserError`."""
    import filelock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=timeout_s)
    except filelock.Timeout:
        raise UserError(f"{path}: still locked by another process after {timeout_s:.0f} s (a concurrent "
                        f"`agent-gspo prepare` into the same folder?)") from None
    try:
        yield
    finally:
        lock.release()


def _remove(path: Path) -> None:
    """Remove a file, folder or symlink; a symlink is unlinked, never followed (its target stays)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def check_writable_dir(path: str | os.PathLike[str], what: str) -> None:
    """Raise :class:`UserError` unless ``path`` is a folder we can write in, or can be created as one.

    Run before a job writes anything, so an unusable output or report folder fails at once with one
    message instead of a traceback after other outputs were already replaced. Nothing is created:
    the probe is a temporary file in ``path`` (or a temporary folder in its nearest existing
    ancestor), removed at once; unique names keep concurrent probes apart.
    """
    path = Path(path)
    probe = next((p for p in (path, *path.parents) if os.path.lexists(p)), Path("."))
    if not probe.is_dir():
        where = "exists" if probe == path else f"{probe} exists"
        raise UserError(f"{what} {path}: {where} and is not a folder")
    try:
        if probe == path:
            with tempfile.TemporaryFile(dir=path):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=probe))
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot write there ({exc.strerror or exc})") from None


def check_output_file(path: str | os.PathLike[str], what: str) -> None:
    """Raise :class:`UserError` unless ``path`` can be written as a file: not a folder, not a device
    or other special file, in a folder that can be written (or created). Run before the work whose
    result goes there, so a typo fails at once instead of after hours, with a traceback."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path}: is a folder, not a file")
    if path.exists() and not path.is_file():
        raise UserError(f"{what} {path}: exists and is not a regular file")
    check_writable_dir(path.parent, f"{what} folder")


def recover_leftovers(target: str | os.PathLike[str]) -> list[str]:
    """Clean what an interrupted :func:`atomic_dir` / :func:`atomic_path` of ``target`` left behind.

    Staging folders and temporary files go. A backup ``.<name>.old-*`` is the previous content of
    a swap cut between its two renames: it becomes ``target`` again when ``target`` is missing,
    else it goes. Call only while holding the lock every writer of ``target`` takes (then no
    leftover can belong to a write in progress). Returns what was done, one line per entry."""
    target = Path(target)
    done: list[str] = []
    if not target.parent.is_dir():
        return done
    prefix = f".{target.name}."
    for entry in sorted(target.parent.iterdir()):
        rest = entry.name[len(prefix):] if entry.name.startswith(prefix) else None
        if rest is None:
            continue
        if entry.is_symlink() and (rest.startswith("old-") or rest.endswith((".staging", ".tmp"))):
            # a swapped-out symlinked target (atomic_dir renames the link itself): put the link back
            # when the swap was cut, else drop it; never follow it, its target is not ours
            if rest.startswith("old-") and not os.path.lexists(target):
                os.replace(entry, target)
                done.append(f"restored {target} from {entry.name}")
                continue
            entry.unlink()
        elif rest.startswith("old-") and entry.is_dir():
            if not os.path.lexists(target):
                os.replace(entry, target)
                done.append(f"restored {target} from {entry.name}")
                continue
            shutil.rmtree(entry)
        elif rest.endswith(".staging") and entry.is_dir():
            shutil.rmtree(entry)
        elif rest.endswith(".tmp") and not entry.is_dir():
            entry.unlink()
        else:
            continue
        done.append(f"removed {entry.name}")
    return done


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, read in blocks and memoised per (path, size, mtime) so a large file
    (model weights, a manifest read by every stage) is hashed once per change."""
    st = os.stat(path)
    return _sha256_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
