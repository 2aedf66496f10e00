"""Answer extraction and checking for the four answer types, plus the predictions-file scorer.

``score_answer`` dispatches on ``answer_type`` (numeric | choice | math | code); ``score_many``
scores a batch in parallel (code programs up to the core count, math in bounded worker
processes); ``score_predictions_file`` implements ``agent-gspo score``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from components.io import atomic_path
from components.scoring.choice import extract_choice, score_choice
from components.scoring.code import build_program, score_code, to_score
from components.scoring.math_grader import extract_math_answer, get_pool, score_math
from components.scoring.numeric import extract_number, score_numeric
from components.scoring.result import ScoreResult, ScoringError
from components.scoring.sandbox import SandboxResult, run_many, run_program

ANSWER_TYPES = ("numeric", "choice", "math", "code")

__all__ = [
    "ANSWER_TYPES", "SandboxResult", "ScoreResult", "ScoringError", "extract_choice",
    "extract_math_answer", "extract_number", "run_many", "run_program", "score_answer",
    "score_many", "score_predictions_file",
]


def _meta(meta: Any) -> dict[str, Any]:
    if meta is None:
        return {}
    if isinstance(meta, str):  # parquet stores meta as a JSON string
        try:
            meta = json.loads(meta) if meta.strip() else {}
        except json.JSONDecodeError as exc:
            raise ScoringError(f"meta is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ScoringError(f"meta must be a dict, got {type(meta).__name__}")
    return meta


def score_answer(answer_type: str, prediction: str, gold: str, meta: dict | None = None, *,
                 timeout_s: float = 10.0) -> ScoreResult:
    """Score one raw model output against the gold answer of a normalised record."""
    meta = _meta(meta)
    prediction = "" if prediction is None else str(prediction)
    if answer_type == "numeric":
        return score_numeric(prediction, gold)
    if answer_type == "choice":
        return score_choice(prediction, gold, meta)
    if answer_type == "math":
        return score_math(prediction, gold, timeout_s=timeout_s)
    if answer_type == "code":
        return score_code(prediction, meta, timeout_s=timeout_s)
    raise ScoringError(f"unknown answer_type {answer_type!r}; expected one of {', '.join(ANSWER_TYPES)}")


def score_many(items: Sequence[tuple[str, str, str, dict]], *, workers: int | None = None,
               timeout_s: float = 10.0) -> list[ScoreResult]:
    """Score (answer_type, prediction, gold, meta) tuples; results in input order.

    Code programs run in parallel sandboxes (``workers``, default the core count); math items
    go through the bounded math-verify process pool (threads here only wait on it).
    """
    n_workers = max(1, workers or os.cpu_count() or 1)
    for i, item in enumerate(items):
        if len(item) != 4 or item[0] not in ANSWER_TYPES:
            raise ScoringError(f"score_many: item {i} must be (answer_type, prediction, gold, meta) with "
                               f"answer_type in {ANSWER_TYPES}, got {item!r:.200}")
    results: list[ScoreResult | None] = [None] * len(items)
    code_idx = [i for i, it in enumerate(items) if it[0] == "code"]
    if code_idx:
        programs = [build_program(str(items[i][1] or ""), _meta(items[i][3])) for i in code_idx]
        for i, res in zip(code_idx, run_many(programs, timeout_s, n_workers), strict=True):
            results[i] = to_score(res)
    math_idx = [i for i, it in enumerate(items) if it[0] == "math"]
    if math_idx:
        pool = get_pool(n_workers)
        with ThreadPoolExecutor(max_workers=pool.max_workers) as ex:
            scored = ex.map(lambda i: score_math(str(items[i][1] or ""), items[i][2], timeout_s=timeout_s,
                                                 pool=pool), math_idx)
            for i, res in zip(math_idx, scored, strict=True):
                results[i] = res
    for i, (kind, pred, gold, meta) in enumerate(items):
        if results[i] is None:
            results[i] = score_answer(kind, pred, gold, meta, timeout_s=timeout_s)
    return [r for r in results if r is not None]


def _read_predictions(path: Path) -> list[tuple[int, Any, str]]:
    """(line number, id, prediction) per non-empty line; errors name the file and line."""
    if not path.is_file():
        raise ScoringError(f"predictions file {path} does not exist")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ScoringError(f"{path}:{lineno}: malformed JSON ({exc.msg})") from exc
            if not isinstance(obj, dict) or "id" not in obj or "prediction" not in obj:
                raise ScoringError(f"{path}:{lineno}: expected an object with keys 'id' and 'prediction'")
            pred = obj["prediction"]
            if pred is not None and not isinstance(pred, str):
                raise ScoringError(f"{path}:{lineno}: 'prediction' must be a string or null")
            rows.append((lineno, obj["id"], pred or ""))
    return rows


def score_predictions_file(records: list[dict], predictions_path: Path, out_path: Path | None = None, *,
                           timeout_s: float = 10.0, workers: int | None = None) -> dict:
    """Score a JSON-lines predictions file against normalised records (``agent-gspo score``).

    Writes ``{"id","correct","extracted","error"}`` per prediction to ``out_path`` (atomic) and
    returns ``{n, correct, accuracy, errors, missing_ids, unknown_ids}``; ``errors`` counts
    grader failures, ``missing_ids`` lists records without a prediction.
    """
    predictions_path = Path(predictions_path)
    by_id: dict[str, dict] = {}
    for rec in records:
        if "id" not in rec or "answer_type" not in rec or "answer" not in rec:
            raise ScoringError(f"record {rec!r:.200} lacks id, answer or answer_type")
        by_id[str(rec["id"])] = rec
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
    items = []
    for _, pid, pred in rows:
        rec = by_id[str(pid)]
        meta = dict(_meta(rec.get("meta")))
        if rec.get("choices") is not None and "choices" not in meta:
            meta["choices"] = list(rec["choices"])
        items.append((rec["answer_type"], pred, str(rec["answer"]), meta))
    results = score_many(items, workers=workers, timeout_s=timeout_s)
    if out_path is not None:
        with atomic_path(out_path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            for (_, pid, _), res in zip(rows, results, strict=True):
                fh.write(json.dumps({"id": pid, "correct": res.correct, "extracted": res.extracted,
                                     "error": res.error}) + "\n")
    n = len(results)
    correct = sum(r.correct for r in results)
    return {
        "n": n,
        "correct": correct,
        "accuracy": correct / n if n else 0.0,
        "errors": sum(r.error is not None for r in results),
        "missing_ids": [i for i in by_id if i not in seen],
        "unknown_ids": [],  # unknown ids are an error (raised above); kept for the summary schema
    }
