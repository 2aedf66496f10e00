"""Atomic file and folder writes: a failed run never leaves a half-written output.

A process killed in the middle (SIGKILL, power loss) can still leave the temporary names below
beside the target; :func:`recover_leftovers`, called while holding the target's
:func:`file_lock`, removes them (or finishes an interrupted swap) before the next write.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from components.errors import ENVIRONMENT_ERRNOS, UserError


def _umask_mode(base: int) -> int:
    """``base`` filtered by the process umask (mkstemp/mkdtemp would leave 0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def apply_umask_modes(root: str | os.PathLike[str]) -> None:
    """Give every file under ``root`` ``0666 & ~umask`` and every folder (``root`` too) ``0777 & ~umask``.

    Libraries write some files owner-only (transformers' shard writer leaves ``model.safetensors``
    0600 while the rest of a model folder is 0644), so a tracking server, ``mlflow models serve`` or an
    evaluation under another uid could not read the weights. Symlinks are left alone (chmod would
    follow them out of the folder), as are files of another owner (ranks of a run under other uids)."""
    file_mode, dir_mode = _umask_mode(0o666), _umask_mode(0o777)
    for dirpath, dirs, files in os.walk(root):
        for name, mode in [(n, file_mode) for n in files] + [(n, dir_mode) for n in dirs]:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                with contextlib.suppress(PermissionError):
                    os.chmod(path, mode)
    os.chmod(root, dir_mode)


FULL_BELOW_BYTES = 1 << 20
"""free space under which a failed write is taken for a full device"""


def _device_full(path: str | os.PathLike[str]) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BELOW_BYTES


def environment_error(exc: BaseException, target: str | os.PathLike[str],
                      device: str | os.PathLike[str] | None = None) -> OSError | None:
    """The ``OSError`` naming ``target`` to raise instead of ``exc`` when ``exc`` is a write that failed
    on a full disk, a quota or a read-only file system (the CLI's one line, exit 2); else None.

    Libraries wrap these in their own errors: tokenizers raises a bare ``Exception("No space left on
    device (os error 28)")``, safetensors its ``SafetensorError``, torch.save a RuntimeError that does
    not even say so. Their text is matched against the OS's own wording; an error without it counts
    as ENOSPC when ``device`` (default ``target``) has less than :data:`FULL_BELOW_BYTES` free: call
    this before a cleanup frees the space. A :class:`UserError` (bad input) is never rewritten."""
    if not isinstance(exc, Exception) or isinstance(exc, UserError):
        return None
    code: int | None = None
    if isinstance(exc, OSError):
        code = exc.errno if exc.errno in ENVIRONMENT_ERRNOS else None
    else:
        text = str(exc)
        code = next((c for c in ENVIRONMENT_ERRNOS if os.strerror(c) in text), None)
        if code is None and _device_full(device if device is not None else target):
            code = errno.ENOSPC
    return None if code is None else OSError(code, os.strerror(code), str(target))


@contextlib.contextmanager
def naming_environment_errors(target: str | os.PathLike[str],
                              device: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Raise :func:`environment_error`'s ``OSError`` (naming ``target``) for what the block raises."""
    try:
        yield
    except Exception as exc:
        mapped = environment_error(exc, target, device)
        if mapped is None:
            raise
        raise mapped from exc


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` only on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with naming_environment_errors(target):  # the user never sees the temporary name
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


def write_bytes_atomic(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(target: str | os.PathLike[str], obj: Any) -> None:
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh staging folder; on success swap it in for ``target`` (old one removed).

    The swap is two renames (old -> backup, staging -> target), so a crash between them leaves
    the previous contents in ``<target>.old-*``, never a mix of old and new files. A ``target``
    that is a symlink is replaced by the new folder; the link is removed, what it points to is
    never touched. Several folders swapped as one: :func:`staging_dir` + :func:`swap_in`.
    Everything in the new folder gets the umask modes (:func:`apply_umask_modes`).
    """
    target = Path(target)
    staging = staging_dir(target)
    try:
        yield staging
        swap_in([(staging, target)])
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def staging_dir(target: str | os.PathLike[str]) -> Path:
    """A fresh empty folder beside ``target`` named ``.<name>.*.staging`` (what :func:`recover_leftovers`
    clears after a crash): write the new contents there, then :func:`swap_in`. The caller removes it
    if it never swaps it in."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with naming_environment_errors(target):  # the user never sees the temporary name
        return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".staging", dir=target.parent))


def swap_in(pairs: Sequence[tuple[Path, Path]]) -> None:
    """Rename each ``(staging, target)`` staging folder over its target: all of them or none.

    Each swap is two renames (old target -> ``.<name>.old-*``, staging -> target). The backups are
    removed only once every target is in place; an error (or Ctrl-C) part-way renames the swapped
    ones back, so the targets are all new or all as before, and the staging folders not swapped in
    stay for the caller to remove. Only a SIGKILL inside this window of a few renames can leave
    some targets new and others old (each whole); :func:`recover_leftovers` then puts back a
    target whose own two renames were cut apart.
    """
    done: list[tuple[Path, Path, Path | None]] = []
    try:
        for staging, target in pairs:
            apply_umask_modes(staging)  # library-written files too (model.safetensors is 0600)
            backup = None
            if os.path.lexists(target):
                backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                backup.rmdir()
                os.replace(target, backup)
            try:
                os.replace(staging, target)
            except BaseException:
                if backup is not None:
                    os.replace(backup, target)
                raise
            done.append((staging, target, backup))
    except BaseException:
        for staging, target, backup in reversed(done):
            with contextlib.suppress(OSError):
                os.replace(target, staging)
                if backup is not None:
                    os.replace(backup, target)
        raise
    for _, _, backup in done:
        if backup is not None:
            _remove(backup)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], timeout_s: float = 600.0,
              busy: Callable[[Path, float], Exception] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) across processes and threads.

    ``filelock`` (``flock``): released by the kernel when the holder dies, so a killed run never
    leaves a stale lock. Waiting longer than ``timeout_s`` (0: not at all) raises ``busy(path,
    timeout_s)``, by default a :class:`UserError` naming the file. The one lock of the project:
    prepare's folders, one training per run folder, one promotion per registered model."""
    import filelock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=timeout_s)
    except filelock.Timeout:
        raise (busy or _still_locked)(path, timeout_s) from None
    try:
        yield
    finally:
        lock.release()


def _still_locked(path: Path, timeout_s: float) -> UserError:
    return UserError(f"{path}: still locked by another process after {timeout_s:.0f} s (a concurrent "
                     f"`agent-gspo prepare` into the same folder?)")


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


_CHECKOUT = Path(__file__).resolve().parents[1]
PIPELINE_FILE_NAMES = ("manifest.json", "dvc.yaml", "dvc.lock")
"""files that are inputs of the pipeline wherever they are, in any letter case (prepared data's
``manifest.json``, the mirror's ``MANIFEST.json``)"""
PIPELINE_CODE = (_CHECKOUT / "components", _CHECKOUT / "flows", _CHECKOUT / "experiments", _CHECKOUT / "params.yaml")
"""the checkout's code (the product's, and the study's ``experiments/``: named as a path, never imported)"""
_INPUTS: set[Path] = set()


def register_pipeline_inputs(*paths: str | os.PathLike[str] | None) -> None:
    """Set the pipeline inputs output options must not name: :func:`components.config.load_config`
    sets the params file it read, ``data.out_dir`` and ``data.mirror`` (relative paths: from the
    current folder), so the outputs checked after it are checked against the config in use (the
    last one loaded replaces them; the checkout's code and params.yaml are always protected)."""
    _INPUTS.clear()
    _INPUTS.update(Path(p).resolve() for p in paths if p)


def _pipeline_input(path: Path, data_folder_ok: bool = False) -> str | None:
    """Why ``path`` (resolved: a symlink counts as its target) is an input of the pipeline, or None."""
    where = path.resolve()
    if where.name.lower() in PIPELINE_FILE_NAMES:
        return f"a {where.name} file"
    for top in (*PIPELINE_CODE, *sorted(_INPUTS)):
        if data_folder_ok and where == top and top in _INPUTS and not top.is_file():
            continue  # a registered data folder itself: what `prepare --out` exists to replace
        if where == top or top in where.parents:
            return f"{'inside ' if where != top else ''}{top}"
    with contextlib.suppress(OSError):  # a hard link to the params file is the params file
        if path.exists() and any(p.is_file() and os.path.samefile(path, p) for p in _INPUTS):
            return "a link to a pipeline input"
    return None


def check_not_pipeline_input(path: str | os.PathLike[str], option: str, *, data_folder_ok: bool = False) -> None:
    """Raise :class:`UserError` naming ``option`` when an output path is an input of the pipeline: the
    params file, any ``manifest.json``/``dvc.yaml``/``dvc.lock``, anything under ``data.out_dir``,
    ``data.mirror``, ``components/``, ``flows/`` or ``experiments/`` (the symlink's target, not the link, is
    judged). One check for every output option, run before anything is written. ``data_folder_ok``: the
    path may *be* ``data.out_dir`` or ``data.mirror`` (not be inside one): ``prepare --out``, which
    refuses the mirror itself with its own message (``components.data.outputs.check_out_vs_mirror``)."""
    why = _pipeline_input(Path(path), data_folder_ok)
    if why:
        raise UserError(f"{option} {path}: is {why}, an input of the pipeline; writing there would replace it "
                        "(nothing was written; give another path)")


def check_output_file(path: str | os.PathLike[str], what: str) -> None:
    """Raise :class:`UserError` unless ``path`` can be written as a file: not a folder, not a device
    or other special file, not an input of the pipeline (:func:`check_not_pipeline_input`), in a
    folder that can be written (or created). Run before the work whose result goes there, so a typo
    fails at once instead of after hours, with a traceback."""
    check_not_pipeline_input(path, what)
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


_MATCHED: set[tuple[str, int, int, int, str]] = set()
"""(resolved path, size, mtime_ns, inode, sha256) of the files :func:`read_matching` found to match"""


def read_matching(path: str | os.PathLike[str], sha256: str) -> tuple[bytes, str]:
    """A file's bytes and their sha256: ``sha256`` itself when they match it, else what they hash to.

    The bytes returned are the bytes hashed, so no change between a check and a later read can slip
    through. A match is remembered per (resolved path, size, mtime_ns, inode): a file read again
    unchanged in the same process is not hashed again."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        data = fh.read()
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino, sha256)
    if key in _MATCHED and len(data) == st.st_size:
        return data, sha256
    actual = hashlib.sha256(data).hexdigest()
    if actual == sha256:
        _MATCHED.add(key)
    return data, actual
