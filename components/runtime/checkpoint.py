"""Atomic, resumable training checkpoints.

Layout of ``<out_dir>/checkpoints/step-000010/``::

    model/              HF weights + tokenizer (``from_pretrained`` loads it); rank 0 writes
    engine/             optimizer + scheduler + counters: ``engine_state.pt`` (torch engine) or
                        ``deepspeed/state/*`` (DeepSpeed ``save_checkpoint``: every rank writes
                        its ZeRO shard, the only layout that is right for every stage)
    rng/rank-00000.pt   python / numpy / torch CPU / CUDA RNG states, one file per rank
    extra.json          caller state (dual controller, data cursor, config hash, metrics history);
                        ``extra.pkl`` when it is not JSON-serialisable
    meta.json           step, engine kind, world size, the sha256 of every other file (``files``);
                        written last = "this checkpoint is complete"

Atomicity: everything is written into ``checkpoints/.tmp-step-000010`` (a name every rank can
compute), fsynced, then renamed to ``step-000010`` by rank 0 in one ``os.replace``. A crash at any
point leaves either no ``step-*`` folder or a complete one; :func:`latest_checkpoint` only accepts
``step-NNNNNN`` folders holding ``meta.json``, so leftovers are never resumed from.

Integrity (format 2): ``meta.json`` lists the sha256 of every file of the folder, hashed after they
were written and before the rename, so the list is published atomically with them.
:func:`verify_checkpoint` (run by ``--resume`` before the model loads) re-hashes them: a changed,
missing or added file is one :class:`CheckpointError` naming it (a flipped low bit of a weight parses
and is finite, so nothing else would notice). A format-1 checkpoint (no hashes) resumes with a
warning on stderr: it was written by an earlier version of this code and cannot be checked.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from components.io import apply_umask_modes, environment_error

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
from components.runtime.checkpoint_errors import (
    CheckpointError,
    _optimizer_problem,
    _reading,
    _weights_problem,
    applying,
    incompatible,
)
from components.runtime.checkpoint_integrity import hash_files, integrity_problem
from components.runtime.distributed import barrier
from components.runtime.engines import TrainEngine

CHECKPOINTS = "checkpoints"
_STEP_RE = re.compile(r"^step-(\d{6,})$")
_TMP_PREFIX = ".tmp-step-"
FORMAT_VERSION = 2


@dataclass(frozen=True)
class CheckpointMeta:
    """Contents of ``meta.json``."""

    step: int
    """training step the checkpoint was taken after"""
    engine: str
    """engine kind that wrote it (torch | deepspeed)"""
    world_size: int
    """number of ranks that wrote it"""
    extra_format: str
    """json | pickle"""
    created: float
    """unix time"""
    version: int = FORMAT_VERSION
    files: dict[str, str] | None = None
    """relative path -> sha256 of every other file of the folder (format 2; None in format 1)"""


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def step_of(checkpoint: str | os.PathLike[str]) -> int:
    """The step a ``step-NNNNNN`` checkpoint folder was saved after (inverse of :func:`step_dir_name`)."""
    m = _STEP_RE.match(Path(checkpoint).name)
    if m is None:
        raise ValueError(f"{checkpoint}: not a step-NNNNNN checkpoint folder")
    return int(m.group(1))


def _fsync_tree(root: Path) -> None:
    """fsync every file, then every folder bottom-up, so the rename publishes durable data."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and (when present) every CUDA device's RNG state."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    missing = [k for k in ("python", "numpy", "torch") if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"RNG state lacks {missing}")
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_extra(folder: Path, extra: dict[str, Any]) -> str:
    """JSON when it round-trips exactly (no tuples, int keys, objects), else pickle."""
    try:
        text = json.dumps(extra, indent=2, sort_keys=True, allow_nan=True)
        exact = json.loads(text) == extra
    except (TypeError, ValueError):
        exact = False
    if not exact:
        with open(folder / "extra.pkl", "wb") as fh:
            pickle.dump(extra, fh, protocol=pickle.HIGHEST_PROTOCOL)
        return "pickle"
    (folder / "extra.json").write_text(text + "\n")
    return "json"


def save_checkpoint(out_dir: str | os.PathLike[str], step: int, engine: TrainEngine,
                    tokenizer: PreTrainedTokenizerBase | None = None, *, extra: dict[str, Any] | None = None,
                    keep: int | None = None) -> Path:
    """Write ``<out_dir>/checkpoints/step-NNNNNN`` atomically and return its path.

    Collective: every rank must call it (DeepSpeed shards and per-rank RNG). ``keep`` prunes to
    the last ``keep`` checkpoints afterwards. An existing folder for the same step is replaced.
    """
    if step < 0:
        raise CheckpointError(f"save_checkpoint: step={step} must be >= 0")
    info = engine.dist
    root = Path(out_dir) / CHECKPOINTS
    final = root / step_dir_name(step)
    tmp = root / f"{_TMP_PREFIX}{step:06d}"
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # leftover of a crashed save of the same step
        tmp.mkdir(parents=True)
    barrier()
    try:
        engine.save_checkpoint_state(tmp / "engine")
        (tmp / "rng").mkdir(exist_ok=True)
        torch.save(rng_state(), tmp / "rng" / f"rank-{info.rank:05d}.pt")
        with engine.gathered_parameters():
            if info.is_main:
                engine.module.save_pretrained(tmp / "model")
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp / "model")
        barrier()
        if info.is_main:
            fmt = _write_extra(tmp, dict(extra or {}))
            meta = CheckpointMeta(step=step, engine=engine.kind, world_size=info.world_size, extra_format=fmt,
                                  created=time.time(), files=hash_files(tmp))
            (tmp / "meta.json").write_text(json.dumps(meta.__dict__, indent=2) + "\n")
            apply_umask_modes(tmp)  # transformers writes model.safetensors 0600
            _fsync_tree(tmp)
            if final.exists():
                trash = root / f".trash-{final.name}-{os.getpid()}"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(root)
            if keep is not None:
                prune_checkpoints(out_dir, keep)
    except BaseException as exc:
        # safetensors and torch.save wrap ENOSPC in their own errors (torch's does not even say so):
        # a write that failed on a full device is reported as what it is, before the cleanup frees space
        mapped = environment_error(exc, tmp, device=root)
        if info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if mapped is not None:
            raise mapped from exc
        raise
    barrier()
    return final


def verify_checkpoint(path: str | os.PathLike[str]) -> None:
    """Re-hash every file of a checkpoint against ``meta.json``; :class:`CheckpointError` naming the
    first file that changed, went missing or was added. Format 1 (no hashes): a warning, no check."""
    path = Path(path)
    meta = read_meta(path)
    if meta.files is None:
        print(f"WARNING: {path}: checkpoint of format {meta.version} holds no file hashes (written before "
              f"format 2): resuming from it without an integrity check", file=sys.stderr)
        return
    problem = integrity_problem(path, meta.files)
    if problem:
        raise CheckpointError(f"{path / problem[0]}: {problem[1]}; delete the checkpoint folder {path} (--resume "
                              "then takes the one before it) or start over with --overwrite")


def list_checkpoints(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints (``step-NNNNNN`` with ``meta.json``), oldest first."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_RE.match(p.name)) and p.is_dir() and (p / "meta.json").is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """Newest complete checkpoint, or None. Temporary and incomplete folders are ignored."""
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def prune_checkpoints(out_dir: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints and stale temporary folders; return what went."""
    if keep < 1:
        raise CheckpointError(f"gspo.keep_checkpoints={keep} must be >= 1")
    ckpts = list_checkpoints(out_dir)
    removed = ckpts[:-keep]
    root = Path(out_dir) / CHECKPOINTS
    removed += [p for p in root.iterdir() if p.name.startswith((_TMP_PREFIX, ".trash-"))]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def read_meta(path: str | os.PathLike[str]) -> CheckpointMeta:
    """``meta.json`` of a checkpoint; :class:`CheckpointError` if it is missing (incomplete)."""
    meta_path = Path(path) / "meta.json"
    if not meta_path.is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no meta.json); "
                              f"use latest_checkpoint() or pass a step-NNNNNN folder")
    with _reading(meta_path, Path(path)):
        raw = json.loads(meta_path.read_text())
    try:
        meta = CheckpointMeta(**raw)
    except TypeError as exc:  # fields missing or unknown: written by something else, or edited
        raise CheckpointError(f"{meta_path}: corrupt or unreadable checkpoint file (not checkpoint metadata: "
                              f"{exc}); resume from an earlier step (remove {path}) or start over with "
                              "--overwrite") from exc
    problem = _meta_problem(meta, Path(path).name)
    if problem:
        raise incompatible(meta_path, Path(path), problem)
    return meta


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _meta_problem(meta: CheckpointMeta, folder: str) -> str | None:
    """What is wrong with the fields of a parsed ``meta.json`` (None: nothing); the step must be the
    one in the folder's name (a folder renamed or a file copied from another checkpoint)."""
    if not _is_int(meta.step) or meta.step < 0:
        return f"step {meta.step!r} is not a step number"
    if meta.engine not in ("torch", "deepspeed"):
        return f"engine {meta.engine!r} is not torch or deepspeed"
    if not _is_int(meta.world_size) or meta.world_size < 1:
        return f"world_size {meta.world_size!r} is not a number of ranks"
    if meta.extra_format not in ("json", "pickle"):
        return f"extra_format {meta.extra_format!r} is not json or pickle"
    if not isinstance(meta.created, int | float) or isinstance(meta.created, bool):
        return f"created {meta.created!r} is not a time"
    if not _is_int(meta.version) or not 1 <= meta.version <= FORMAT_VERSION:
        return f"format version {meta.version!r}; this code reads 1 to {FORMAT_VERSION}"
    if meta.version >= 2 and not (isinstance(meta.files, dict) and all(
            isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v)
            for k, v in meta.files.items())):
        return "files is not a mapping of file names to sha256 hashes"
    named = _STEP_RE.match(folder)
    if named and int(named.group(1)) != meta.step:
        return f"step {meta.step} but the folder is {folder}"
    return None


def load_hf_weights(module: nn.Module, model_dir: Path) -> None:
    """Copy weights saved by ``save_pretrained`` back into ``module`` in place (bit-exact).

    In place (not ``from_pretrained``) because the engine's optimizer holds these very
    parameter objects. Handles single-file and sharded safetensors and PEFT adapters; keys the
    file lacks are allowed only when they are tied to a loaded tensor (e.g. ``lm_head``).
    """
    from safetensors.torch import load_file

    adapter = model_dir / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        with _reading(adapter, model_dir.parent):
            weights = load_file(str(adapter))
        result = set_peft_model_state_dict(module, weights)
        if getattr(result, "unexpected_keys", None):
            raise CheckpointError(f"{adapter}: unexpected adapter keys {result.unexpected_keys[:5]}")
        return
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        with _reading(index, model_dir.parent):
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise CheckpointError(f"{model_dir}: no model.safetensors(.index.json) or adapter_model.safetensors")
    state: dict[str, torch.Tensor] = {}
    own_shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    for name in files:
        with _reading(model_dir / name, model_dir.parent):
            part = load_file(str(model_dir / name))
        problem = _weights_problem(part, own_shapes)
        if problem:
            raise incompatible(model_dir / name, model_dir.parent, problem)
        state.update(part)
    with applying(model_dir, model_dir.parent):
        missing, unexpected = module.load_state_dict(state, strict=False)
    if unexpected:
        raise CheckpointError(f"{model_dir}: weights not in the model: {unexpected[:5]}")
    own = module.state_dict(keep_vars=True)
    loaded_ptrs = {own[k].data_ptr() for k in state if k in own}
    untied = [k for k in missing if own[k].data_ptr() not in loaded_ptrs]
    if untied:
        raise CheckpointError(f"{model_dir}: checkpoint lacks weights {untied[:5]}")


def extra_file(path: str | os.PathLike[str]) -> Path:
    """The caller-state file of a checkpoint (``extra.json`` or ``extra.pkl``, as ``meta.json`` says)."""
    return Path(path) / ("extra.pkl" if read_meta(path).extra_format == "pickle" else "extra.json")


def read_extra(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The caller state of a checkpoint (``extra.json`` / ``extra.pkl``), without loading anything
    else: a resume checks its config hash before the engine state is applied."""
    path = Path(path)
    file = extra_file(path)
    with _reading(file, path):
        if file.suffix == ".pkl":
            with open(file, "rb") as fh:
                extra = pickle.load(fh)
        else:
            extra = json.loads(file.read_text())
    if not isinstance(extra, dict):
        raise CheckpointError(f"{file}: corrupt or unreadable checkpoint file (a {type(extra).__name__}, "
                              f"not a mapping); resume from an earlier step (remove {path}) or start over with "
                              "--overwrite")
    return extra


def load_checkpoint(path: str | os.PathLike[str], engine: TrainEngine) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, counters and this rank's RNG; return ``extra``.

    Collective. The RNG file of this rank is used; if the world size changed (torch engine only)
    ranks without their own file take rank 0's states.
    """
    path = Path(path)
    meta = read_meta(path)
    if meta.engine != engine.kind:
        raise CheckpointError(f"{path}: written by the {meta.engine} engine, cannot load into {engine.kind} "
                              f"(set gspo.engine: {meta.engine})")
    if meta.engine == "deepspeed" and meta.world_size != engine.dist.world_size:
        raise CheckpointError(f"{path}: DeepSpeed checkpoint of world size {meta.world_size}, "
                              f"running with {engine.dist.world_size}")
    if not engine.restores_weights:
        load_hf_weights(engine.module, path / "model")
    state_file = path / "engine" / "engine_state.pt"  # the torch engine's one file; DeepSpeed's is a folder
    with applying(state_file if state_file.is_file() else path / "engine", path):
        engine.load_checkpoint_state(path / "engine")
    problem = _optimizer_problem(getattr(engine, "optimizer", None))
    if problem:
        raise incompatible(state_file if state_file.is_file() else path / "engine", path, problem)
    rng_file = path / "rng" / f"rank-{engine.dist.rank:05d}.pt"
    if not rng_file.is_file():
        rng_file = path / "rng" / "rank-00000.pt"
    if not rng_file.is_file():
        raise CheckpointError(f"{path}/rng: no RNG state file")
    with applying(rng_file, path):
        set_rng_state(torch.load(rng_file, weights_only=False))
    extra = read_extra(path)
    barrier()  # every rank finished reading before anyone may prune or overwrite
    return extra


__all__ = [
    "CheckpointError", "CheckpointMeta", "applying", "extra_file", "incompatible", "latest_checkpoint",
    "list_checkpoints", "load_checkpoint", "load_hf_weights", "prune_checkpoints", "read_extra", "read_meta",
    "rng_state", "save_checkpoint", "set_rng_state", "step_dir_name", "verify_checkpoint",
]
