"""Answer extraction and checking for the four answer types, plus the predictions-file scorer.

:mod:`components.scoring.grader` is the one grader (``extract``, ``grade``, ``grade_many``) used by
voting, the reward, evaluation and ``agent-gspo score`` (:func:`score_predictions_file`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from components.data.item import Item
from components.io import atomic_path, check_output_file
from components.scoring.choice import extract_choice
from components.scoring.grader import extract, grade, grade_many
from components.scoring.math_grader import extract_math_answer
from components.scoring.numeric import extract_number
from components.scoring.result import ScoreResult, ScoringError
from components.scoring.sandbox import SandboxResult, run_many, run_program

__all__ = [
    "SandboxResult", "ScoreResult", "ScoringError", "extract", "extract_choice", "extract_math_answer",
    "extract_number", "grade", "grade_many", "run_many", "run_program", "score_predictions_file",
]


class _RepeatedKey(ValueError):
    """A JSON object names one key twice (raised by :func:`_unique_keys`)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing repeated keys: ``json`` keeps the last value silently, so
    ``{"prediction": "1", "prediction": "2"}`` would be graded on an answer the writer may not
    have meant (and another JSON reader could take the first one)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _RepeatedKey(key)
        obj[key] = value
    return obj


def _check_out(out: Path, predictions: Path, protected: tuple[str | os.PathLike[str] | None, ...]) -> None:
    """``--out`` must be a writable regular file (not a folder, device or FIFO: ``/dev/null`` would be
    replaced by a file), not the predictions file, and outside the ``protected`` folders."""
    if out.is_dir():
        raise ScoringError(f"--out {out}: is a folder; give the path of a JSON-lines file to write")
    check_output_file(out, "--out")
    if _same_file(out, predictions):
        raise ScoringError(f"--out {out}: is the predictions file; writing the results there would destroy "
                           "the predictions (give another path)")
    where = out.resolve()
    for folder in filter(None, protected):
        top = Path(folder).resolve()
        if where == top or top in where.parents:
            raise ScoringError(f"--out {out}: is inside {folder}, which holds benchmark data (gold answers); "
                               "give a path outside it")


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once resolved (symlinks, ``..``), or
    one inode when both exist (hard links, bind mounts)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _read_predictions(path: Path) -> list[tuple[int, Any, str]]:
    """(line number, id, prediction) per non-empty line; errors name the file and line."""
    if not path.exists():
        raise ScoringError(f"predictions file {path} does not exist")
    if not path.is_file():  # a folder, a pipe (/dev/stdin), a device: read_bytes would block or never end
        raise ScoringError(f"predictions file {path}: is not a regular file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScoringError(f"predictions file {path}: cannot read it: {exc.strerror or exc}") from exc
    rows = []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScoringError(f"{path}:{lineno}: not UTF-8 text (byte {exc.start + 1} of the line)") from exc
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_unique_keys)
        except _RepeatedKey as exc:
            raise ScoringError(f"{path}:{lineno}: repeated key {exc.args[0]!r} in one object") from None
        except json.JSONDecodeError as exc:
            raise ScoringError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or "id" not in obj or "prediction" not in obj:
            raise ScoringError(f"{path}:{lineno}: expected an object with keys 'id' and 'prediction'")
        pred = obj["prediction"]
        if pred is not None and not isinstance(pred, str):
            raise ScoringError(f"{path}:{lineno}: 'prediction' must be a string or null")
        rows.append((lineno, obj["id"], pred or ""))
    return rows


def score_predictions_file(records: list[Item], predictions_path: Path, out_path: Path | None = None, *,
                           timeout_s: float = 10.0, workers: int | None = None,
                           protected: tuple[str | os.PathLike[str] | None, ...] = ()) -> dict:
    """Score a JSON-lines predictions file against normalised records (``agent-gspo score``).

    Writes ``{"id","correct","extracted","error"}`` per prediction to ``out_path`` (atomic) and
    returns ``{n, n_records, coverage, correct, accuracy, accuracy_on_submitted, errors,
    missing_ids, unknown_ids}``: ``accuracy`` is over *all* records of the split, a missing
    prediction counting as wrong (so submitting only the answers one is sure of cannot pass for
    the benchmark's accuracy); ``accuracy_on_submitted`` is over the ``n`` predictions given and
    ``coverage`` = ``n / n_records``. ``errors`` counts grader failures (a timeout included: it
    is no verdict), ``missing_ids`` lists every record without a prediction and ``n_missing``
    counts them. ``timeout_s`` bounds each program and each maths check (evaluation passes
    ``eval.code_timeout_s``, and so does ``agent-gspo score``). ``out_path`` may not lie in a
    ``protected`` folder (the prepared data and the mirror: gold answers a typo would overwrite).
    """
    predictions_path = Path(predictions_path)
    if out_path is not None:  # before the grading (minutes): a bad path fails at once
        _check_out(Path(out_path), predictions_path, protected)
    by_id = {item.id: item for item in records}
    rows = _read_predictions(predictions_path)
    unknown = [str(pid) for _, pid, _ in rows if str(pid) not in by_id]
    if unknown:
        shown = ", ".join(unknown[:20]) + (f" ... ({len(unknown)} in all)" if len(unknown) > 20 else "")
        raise ScoringError(f"{predictions_path}: ids not in the benchmark records: {shown}")
    seen: dict[str, int] = {}
    for lineno, pid, _ in rows:
        if str(pid) in seen:
            raise ScoringError(f"{predictions_path}:{lineno}: duplicate id {pid!r} (first on line {seen[str(pid)]})")
        seen[str(pid)] = lineno
    results = grade_many([(by_id[str(pid)], pred) for _, pid, pred in rows], workers=workers, timeout_s=timeout_s)
    if out_path is not None:
        try:
            with atomic_path(out_path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
                for (_, pid, _), res in zip(rows, results, strict=True):
                    fh.write(json.dumps({"id": pid, "correct": res.correct, "extracted": res.extracted,
                                         "error": res.error}) + "\n")
        except OSError as exc:
            raise ScoringError(f"--out {out_path}: cannot write it: {exc.strerror or exc}") from exc
    n, n_records = len(results), len(by_id)
    correct = sum(r.correct for r in results)
    missing = [i for i in by_id if i not in seen]
    return {
        "n": n,
        "n_records": n_records,
        "coverage": n / n_records if n_records else 0.0,
        "correct": correct,
        "accuracy": correct / n_records if n_records else 0.0,
        "accuracy_on_submitted": correct / n if n else 0.0,
        "errors": sum(r.error is not None for r in results),
        "n_missing": len(missing),
        "missing_ids": missing,
        "unknown_ids": [],  # unknown ids are an error (raised above); kept for the summary schema
    }
