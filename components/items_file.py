"""The per-item evaluation record ``items.jsonl``: its format (fields, canonical bytes, sha256)
and its reading into paired scores.

The evaluation (:mod:`components.evaluation.items`) writes it; the promotion gate
(:mod:`components.tracking.gate`) reads it back from a run's artifacts and compares two of them
item by item (:func:`components.comparison.paired_verdict`). The format lives here, below both,
so the registry layer never imports the evaluation layer (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import hashlib
import json
import math
import reprlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from components.comparison import ItemScore
from components.errors import UserError

ITEMS_FILE = "items.jsonl"
ITEMS_PARAM = "eval.items_sha256"
"""evaluation-run param: sha256 of the run's items file"""
MAIN_PARAM = "eval.main_system"
"""evaluation-run param: the system whose rows the gate compares"""
ITEMS_ARTIFACT = f"eval/{ITEMS_FILE}"
"""where the evaluation job logs the file among the run's artifacts"""
FIELDS = ("system", "benchmark", "id", "prediction", "extracted", "gold", "correct", "grading_error", "tokens",
          "silence", "transcript")


class ItemsFileError(UserError):
    """An items file that is not a per-item record (bad JSON, missing field, duplicate item)."""


def encode(records: Iterable[Mapping[str, Any]]) -> bytes:
    """The file's bytes: one canonical JSON object per line (sorted keys, UTF-8)."""
    return b"".join(json.dumps(r, sort_keys=True, ensure_ascii=False).encode() + b"\n" for r in records)


def items_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode(data: bytes, where: str) -> list[dict[str, Any]]:
    """Parse an items file's bytes; :class:`ItemsFileError` names ``where`` and the line."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    # split on "\n" only: str.splitlines() also breaks at U+2028, U+0085, ... which json.dumps leaves
    # unescaped inside strings (a model's text can hold them)
    for n, line in enumerate(data.decode("utf-8", errors="strict").split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ItemsFileError(f"{where}, line {n}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise ItemsFileError(f"{where}, line {n}: JSON nested too deeply to be a per-item record") from None
        missing = [f for f in FIELDS if not isinstance(row, dict) or f not in row]
        if missing:
            raise ItemsFileError(f"{where}, line {n}: missing field(s) {', '.join(missing)} (not a per-item record)")
        problem = _bad_value(row)
        if problem:
            raise ItemsFileError(f"{where}, line {n}: {problem} (not a per-item record as evaluate writes it)")
        key = (row["system"], row["benchmark"], row["id"])
        if key in seen:
            raise ItemsFileError(f"{where}, line {n}: item {key[2]!r} of {key[1]} occurs twice for system {key[0]}")
        seen.add(key)
        out.append(row)
    return out


def _bad_value(row: Mapping[str, Any]) -> str | None:
    """What is wrong with the values the gate and the re-grade read, or None. Checked, not coerced:
    ``bool("false")`` is True, so a ``correct`` of ``"false"`` would count as a right answer, and a
    ``tokens`` that is not ``{"total": <number>}`` was a TypeError traceback in :func:`scores`."""
    for f in ("system", "benchmark", "id"):
        if not isinstance(row[f], str):
            return f"field {f!r} is {_shown(row[f])}, not a string"
    if not isinstance(row["correct"], bool):
        return f"field 'correct' is {_shown(row['correct'])}, not true or false"
    tokens = row["tokens"]
    total = tokens.get("total") if isinstance(tokens, dict) else None
    if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total) or total < 0:
        return f"field 'tokens' is {_shown(tokens)}, not {{\"total\": <a finite count >= 0>, ...}}"
    return None


def _shown(value: Any) -> str:
    return f"{reprlib.repr(value)} ({type(value).__name__})"  # bounded in size and depth


def read_items(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ItemsFileError(f"items file {path}: {exc.strerror or exc}") from None
    return decode(data, str(path))


def scores(records: Sequence[Mapping[str, Any]], system: str) -> dict[str, list[ItemScore]]:
    """``{benchmark: [ItemScore]}`` of one system (what :func:`components.comparison.paired_verdict` takes)."""
    out: dict[str, list[ItemScore]] = {}
    for r in records:
        if r["system"] == system:
            out.setdefault(str(r["benchmark"]), []).append(
                ItemScore(str(r["id"]), bool(r["correct"]), float(r["tokens"]["total"])))
    return out


def headline(by_benchmark: Mapping[str, Sequence[ItemScore]]) -> tuple[float, float, int]:
    """``(macro accuracy, total tokens, items)`` as :func:`components.evaluation.metrics.summarise`
    computes them from the aggregates: the numbers an evaluation writes on a registry version."""
    groups = [v for v in by_benchmark.values() if v]
    if not groups:
        return 0.0, 0.0, 0
    acc = sum(statistics.fmean(float(s.correct) for s in v) for v in groups) / len(groups)
    return acc, float(sum(s.tokens_total for v in groups for s in v)), sum(len(v) for v in groups)
