"""An evaluation's outputs are published as one set: all of them, or none.

:func:`publish` has the writer put every file (report.py's layout: ``<benchmark>.json``,
``summary.json``, ``report.md``, two PNGs, ``items.jsonl``) into a staging folder inside ``out_dir`` and only then
moves them into place, so a failure while writing (a full disk, a plot that cannot be drawn,
Ctrl-C) leaves the previous outputs byte-identical and nothing else behind.

Not :func:`components.io.atomic_dir` (a swap of the whole folder): ``out_dir`` is a volume mount in
the Docker and Kubernetes deployments (``/app/eval``), which cannot be renamed, and it may hold
files evaluate did not write (the proof's ``eval/baselines/``, a ``--metrics`` file), which a swap
would drop. So the set is swapped in name by name under a journal, all renames inside ``out_dir``
(same file system, no space needed):

1. every output is written into ``out_dir/.evaluate-*.staging/``;
2. the journal ``.publish.json`` there lists the new names and the previous outputs present;
3. the previous outputs (every name evaluate writes, so also the JSON of a benchmark the new run
   does not have) move into the staging folder's ``.previous/``, ``summary.json`` first; the new
   ones move in, ``summary.json`` last (mid-swap the set is visibly incomplete, never mixed and
   complete-looking);
4. removing the journal commits the new set; the staging folder (with the previous set) goes.

A failure in 3 moves everything back. A run killed before 4 leaves its staging folder; the next
evaluation into the folder removes it (:func:`recover`, under the folder's lock), first moving the
previous outputs back when the journal is there: what a killed evaluation leaves is the previous
set. Names evaluate does not write are never touched, and the lock is the folder itself (no lock
file among the outputs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from components.config import ALL_BENCHMARKS
from components.errors import UserError
from components.io import check_writable_dir, file_lock, write_json_atomic

log = logging.getLogger(__name__)

KEYSTONE = "summary.json"
"""moved out first and in last: a set with it is complete"""
OUTPUT_NAMES = frozenset({*(f"{b}.json" for b in ALL_BENCHMARKS), KEYSTONE, "report.md", "accuracy_vs_tokens.png",
                          "silence_by_agent_round.png", "items.jsonl"})
"""every name an evaluation writes into ``out_dir`` (report.py's layout)"""
STAGING_PREFIX, STAGING_SUFFIX = ".evaluate-", ".staging"
JOURNAL = ".publish.json"
PREVIOUS = ".previous"
FALLBACK_LOCK = ".evaluate.lock"
"""lock file in ``out_dir``, only where the file system cannot lock a folder (NFS)"""
WHAT = "evaluation output folder (--out / eval.out_dir)"


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], timeout_s: float = 600.0) -> Iterator[None]:
    """Exclusive lock on ``folder`` across processes and threads: ``flock`` on the folder itself
    (released by the kernel when the holder dies); where that is unsupported, :func:`file_lock`
    on ``folder/.evaluate.lock``. Waiting longer than ``timeout_s`` raises :class:`UserError`."""
    folder = Path(folder)
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if fcntl is not None else None
    locked = False
    try:
        deadline = time.monotonic() + timeout_s
        while fd is not None and not locked:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise UserError(f"{WHAT} {folder}: still locked by another evaluation after {timeout_s:.0f} s"
                                    ) from None
                time.sleep(0.1)
            except OSError as exc:  # EBADF (NFS: exclusive locks need a writable file), ENOLCK, EINVAL, ...
                log.debug("cannot flock folder %s (%s): using a lock file", folder, exc.strerror)
                break
        if locked:
            yield
        else:
            with file_lock(folder / FALLBACK_LOCK, timeout_s):
                yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def _is_output(path: Path) -> bool:
    """A previous output: a file (or a symlink, never followed) with one of evaluate's names."""
    return path.is_symlink() or path.is_file()


def _roll_back(out_dir: Path, staging: Path) -> None:
    """Undo step 3 of a journalled swap (any prefix of it): the new files go back into ``staging``,
    the previous ones back into ``out_dir``; then the journal goes. Idempotent (a roll back that is
    itself cut is finished by the next :func:`recover`)."""
    journal = json.loads((staging / JOURNAL).read_text())
    for name in journal["new"]:  # all previous outputs left before the first new one came in
        if not os.path.lexists(staging / name) and os.path.lexists(out_dir / name):
            os.replace(out_dir / name, staging / name)
    for name in journal["old"]:
        if os.path.lexists(staging / PREVIOUS / name):
            os.replace(staging / PREVIOUS / name, out_dir / name)
    (staging / JOURNAL).unlink()


def recover(out_dir: str | os.PathLike[str]) -> list[str]:
    """Clean what an evaluation killed while publishing into ``out_dir`` left there: its staging
    folder (after a roll back of a swap it cut, so the previous set is whole again) and temporary
    files of earlier per-file writes of evaluate's names. Call only while holding
    :func:`folder_lock` (then no staging folder belongs to a publish in progress). Returns what
    was done, one line per entry."""
    out_dir = Path(out_dir)
    done: list[str] = []
    if not out_dir.is_dir():
        return done
    for entry in sorted(out_dir.iterdir()):
        name = entry.name
        if name.startswith(STAGING_PREFIX) and name.endswith(STAGING_SUFFIX) and not entry.is_symlink() \
                and entry.is_dir():
            if (entry / JOURNAL).is_file():
                _roll_back(out_dir, entry)
                done.append(f"restored the previous outputs from {name}")
            shutil.rmtree(entry)
        elif name.endswith(".tmp") and any(name.startswith(f".{own}.") for own in OUTPUT_NAMES) \
                and (entry.is_symlink() or not entry.is_dir()):
            entry.unlink()
        else:
            continue
        done.append(f"removed {name}")
    return done


def check_out_dir(out_dir: str | os.PathLike[str]) -> None:
    """Before an evaluation runs: ``out_dir`` is a folder we can write in (or can create), and what
    a killed earlier evaluation left there is cleaned up. Raises :class:`UserError`."""
    check_writable_dir(out_dir, WHAT)
    out_dir = Path(out_dir)
    if out_dir.is_dir():
        with folder_lock(out_dir):
            for line in recover(out_dir):
                log.info("%s: %s (left by an interrupted evaluation)", out_dir, line)


def _staged_names(staged: Mapping[str, Path], staging: Path) -> list[str]:
    names = [Path(p).name for p in staged.values()]
    for path, name in zip(staged.values(), names, strict=True):
        if Path(path).parent != staging or name not in OUTPUT_NAMES or not Path(path).is_file():
            raise ValueError(f"publish: {path} is not an evaluation output written into {staging}")
    if len(set(names)) != len(names):
        raise ValueError(f"publish: an output named twice in {names}")
    return names


def _swap_in(out_dir: Path, staging: Path, names: list[str]) -> None:
    """Steps 2-4 of the module docstring."""
    old = sorted((n for n in OUTPUT_NAMES if _is_output(out_dir / n)), key=lambda n: (n != KEYSTONE, n))
    new = sorted(names, key=lambda n: n == KEYSTONE)
    (staging / PREVIOUS).mkdir()
    write_json_atomic(staging / JOURNAL, {"new": new, "old": old})
    try:
        for name in old:
            os.replace(out_dir / name, staging / PREVIOUS / name)
        for name in new:
            os.replace(staging / name, out_dir / name)
    except BaseException:
        _roll_back(out_dir, staging)
        raise
    (staging / JOURNAL).unlink()  # the commit


def publish(out_dir: str | os.PathLike[str], write: Callable[[Path], Mapping[str, Path]]) -> dict[str, Path]:
    """``write(staging)`` writes the outputs into ``staging`` and returns ``{key: path}``; they then
    replace the previous outputs in ``out_dir`` as one set (see the module docstring). Returns
    ``{key: out_dir / name}`` in ``write``'s order. An :class:`OSError` while writing or swapping
    (the previous outputs stay) is raised naming ``out_dir`` (``No space left on device: eval``)."""
    out_dir = Path(out_dir)
    staging: Path | None = None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with folder_lock(out_dir):
            recover(out_dir)
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, suffix=STAGING_SUFFIX, dir=out_dir))
            try:
                staged = dict(write(staging))
                _swap_in(out_dir, staging, _staged_names(staged, staging))
            finally:
                if not (staging / JOURNAL).exists():  # kept only where a roll back failed: recover() ends it
                    shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        if exc.errno is None or (exc.filename is not None and STAGING_SUFFIX not in str(exc.filename)):
            raise
        raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(out_dir)) from exc
    return {key: out_dir / Path(path).name for key, path in staged.items()}


__all__ = ["OUTPUT_NAMES", "check_out_dir", "folder_lock", "publish", "recover"]
