"""The errors of a checkpoint that cannot be resumed from: a file that does not parse, or one that
parses but does not fit what it is loaded into. Either is one :class:`CheckpointError` naming the
file (exit 2), never a loader's traceback and never a silent fresh start."""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import torch

from components.errors import UserError


class CheckpointError(UserError):
    """A checkpoint folder that is missing, incomplete or does not fit the engine."""


def _unparseable(exc: BaseException) -> bool:
    """Is ``exc`` a loader failing on the bytes it read (not on applying them)? The loaders have
    no common error type: safetensors raises its own, torch's zip reader a RuntimeError naming
    itself, pickle and JSON theirs, a truncated file an EOFError."""
    if isinstance(exc, EOFError | pickle.UnpicklingError | json.JSONDecodeError | UnicodeDecodeError | OSError):
        return True
    if type(exc).__name__ == "SafetensorError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("PytorchStreamReader" in text or "zip archive" in text
                                               or "unexpected EOF" in text or "invalid load key" in text)


@contextlib.contextmanager
def _reading(file: Path, checkpoint: Path) -> Iterator[None]:
    """A checkpoint file that cannot be parsed (truncated, emptied, wrong contents) is bad input:
    one :class:`CheckpointError` naming it and what to do, never a loader's traceback, and never
    a silent fresh start. Whatever the loader raises (safetensors, torch's zip reader, pickle,
    JSON) counts: its message becomes the reason."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        if not _unparseable(exc):
            raise  # the file read fine and applying it failed (a bug, or a setting that changed): not corruption
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{file}: corrupt or unreadable checkpoint file ({type(exc).__name__}: {reason}); "
                              f"resume from an earlier step (remove {checkpoint}) or start over with --overwrite"
                              ) from exc


def incompatible(where: Path, checkpoint: Path, what: str) -> CheckpointError:
    """The one error for a checkpoint part that reads fine but holds the wrong contents."""
    return CheckpointError(f"{where}: corrupt or incompatible checkpoint ({what}); resume from an earlier step "
                           f"(remove {checkpoint}) or start over with --overwrite")


@contextlib.contextmanager
def applying(file: Path, checkpoint: Path) -> Iterator[None]:
    """Reading *and applying* one part of a checkpoint: a file that cannot be parsed is
    :func:`_reading`'s error; one that parses but does not fit what it is loaded into (a state
    without its keys, values of the wrong type, a weight of another shape) raises KeyError,
    ValueError, TypeError or RuntimeError from deep inside torch or the trainer, and is
    :func:`incompatible` naming ``file``: never a traceback, never a silent fresh start. Running out
    of memory is not the checkpoint's fault and keeps its own error."""
    with _reading(file, checkpoint):
        try:
            yield
        except UserError:
            raise
        except (LookupError, ValueError, TypeError, RuntimeError) as exc:
            if _unparseable(exc) or isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
                raise
            reason = (str(exc).strip().splitlines() or [""])[0][:200]
            raise incompatible(file, checkpoint, f"{type(exc).__name__}: {reason}") from exc


def _weights_problem(weights: dict[str, torch.Tensor], own_shapes: dict[str, tuple[int, ...]]) -> str | None:
    """A weight whose shape differs from the model's (a file of another model), or that is not finite
    (resuming would train, and register, a NaN policy); None when all fit."""
    for key, tensor in weights.items():
        if key in own_shapes and tuple(tensor.shape) != own_shapes[key]:
            return f"weight {key} has shape {list(tensor.shape)}, the model's is {list(own_shapes[key])}"
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"weight {key} holds NaN or inf values"
    return None


def _optimizer_problem(optimizer: object) -> str | None:
    """An optimizer state (Adam's moments) that is not finite: it parses and fits, and the first update
    would turn every weight it touches into NaN. None when all are finite (or the state is not a mapping)."""
    state = getattr(optimizer, "state", None)
    if not isinstance(state, dict):
        return None
    for i, entry in enumerate(state.values()):
        for name, value in entry.items() if isinstance(entry, dict) else ():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"optimizer state {name} of parameter {i} holds NaN or inf values"
    return None
