"""The rules of a training output folder (``--out``), checked before the model loads.

One training per folder (:func:`exclusive`); a fresh run never silently reuses or deletes an earlier
run's checkpoints or outputs (:func:`check_fresh_start`, :func:`delete_earlier_run` for
``--overwrite``); a ``--resume`` checks the newest checkpoint's files against their recorded sha256,
its training state and its settings first (:func:`check_resumable`), so none of these fails after minutes
of model loading or a training step. What the hashes cannot catch, a state file replaced *and* re-hashed
in ``meta.json`` (an empty optimizer or RNG state, measured: refused ~5 s later on the tiny model), is
refused by name when the checkpoint is applied, after the model has loaded
(:func:`components.runtime.checkpoint.load_checkpoint`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from components.config import Config
from components.errors import UserError
from components.io import check_writable_dir, file_lock
from components.runtime.checkpoint import CHECKPOINTS, latest_checkpoint, list_checkpoints, verify_checkpoint
from components.runtime.distributed import env_int
from components.runtime.resume import check_resume_config, read_train_state


def check_fresh_start(out: Path, resume: bool, overwrite: bool) -> None:
    """Earlier checkpoints are deleted only when asked: a fresh run into a used folder is refused.

    ``step-*`` folders without ``meta.json`` count too: the atomic rename never leaves one, so
    they are damaged checkpoints, and starting over (with or without ``--resume``) would silently
    replace them. Checked before the model loads, as is that ``out`` can be written at all, and that
    ``checkpoints`` and ``final`` in it, if there, are folders (a file there would fail the first
    checkpoint or the final policy, after the training they were to save)."""
    root = out / CHECKPOINTS
    check_writable_dir(root, "training checkpoints folder")
    final = out / "final"
    if os.path.lexists(final) and not final.is_dir():
        raise UserError(f"final policy folder {final}: exists and is not a folder; remove it or choose another --out")
    found = list_checkpoints(out)
    damaged = sorted(p.name for p in root.iterdir() if p.name.startswith("step-") and p not in found) \
        if root.is_dir() else []
    if found and not resume and not overwrite:
        raise UserError(f"{out} holds checkpoints of an earlier run (newest {found[-1].name}): pass --resume to "
                        f"continue it, or --overwrite to delete them and start over (or choose another --out)")
    newest = found[-1].name if found else ""
    newer = [d for d in damaged if d > newest]  # step-NNNNNN names sort as their steps
    if newer and not overwrite:
        what = f"newer than the last complete one ({newest})" if found else "and none is complete"
        raise UserError(f"{root} holds {', '.join(newer)} without meta.json (damaged checkpoints {what}): resuming "
                        "would replace them silently; move them away to resume from an earlier step, or pass "
                        "--overwrite to delete every checkpoint and start over (or choose another --out)")
    leftovers = [name for name in RUN_OUTPUTS if (out / name).exists()]
    if leftovers and not found and not damaged and not overwrite:
        raise UserError(f"{out} holds the outputs of an earlier run ({', '.join(leftovers)}) but no checkpoint to "
                        "resume: a new run would leave them in place until it finishes (a crash would leave another "
                        "run's final policy looking like this one's); pass --overwrite to delete them and start "
                        "over (or choose another --out)")
    if resume and not found and not damaged and launch_rank() == 0:
        print(f"--resume: no checkpoint in {root}: starting from step 1", file=sys.stderr)


def check_resumable(out: Path, cfg: Config) -> None:
    """The newest checkpoint's trainer state has its keys and types and was written under settings that
    give the same weights: checked before the model loads (minutes, on a real model), cheaply."""
    ckpt = latest_checkpoint(out)
    if ckpt is not None:
        verify_checkpoint(ckpt)  # every file's sha256 against meta.json: a flipped bit is not a resume
        check_resume_config(read_train_state(ckpt), cfg)


RUN_OUTPUTS = ("final", "metrics.json", "history.json", "plots")
"""what a finished run leaves in ``--out`` besides its checkpoints (``--overwrite`` deletes them too)"""


def delete_earlier_run(out: Path) -> None:
    """``--overwrite``: the earlier run's checkpoints *and* outputs go before the new run starts, so a
    crash part-way can never leave the old ``final/`` next to the new run's checkpoints."""
    for name in (CHECKPOINTS, *RUN_OUTPUTS):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def launch_rank() -> int:
    """This process's global rank as the launcher set it (0 without one); before
    :func:`init_distributed`, which checks the variables against each other."""
    return env_int("RANK") if os.environ.get("RANK") else 0


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """One training per output folder: rank 0 holds ``<out>/.train.lock`` for the whole run.

    Two runs into one folder would interleave their checkpoints, and an ``--overwrite`` would
    delete a running one's work while both report success. ``flock`` is released by the kernel
    when the holder dies, so a crashed run never blocks the ``--resume`` that follows it."""
    if launch_rank() != 0:  # the other ranks of one run: rank 0 holds it for them
        yield
        return
    with file_lock(out / ".train.lock", timeout_s=0, busy=_training_running):
        yield


def _training_running(lock: Path, _timeout_s: float) -> UserError:
    return UserError(f"{lock.parent}: another training is running in this folder (it holds {lock}); "
                     "wait for it to finish, or choose another --out")


__all__ = ["RUN_OUTPUTS", "check_fresh_start", "check_resumable", "delete_earlier_run", "exclusive", "launch_rank"]
