"""Code answers (HumanEval): prompt + completion run in the sandbox, the dataset's check in the
trusted judge (see :mod:`components.scoring.sandbox`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from components.scoring.result import ScoreResult, ScoringError
from components.scoring.sandbox import CodeTask, SandboxResult, run_many, run_task

_FENCE_RE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.S)


def extract_completion(prediction: str) -> str:
    """The code to append to the prompt: the first fenced block if the model used markdown
    fences, else the raw text. A full ``def`` works too: it redefines the prompt's function,
    whose docstring-only body is valid Python."""
    m = _FENCE_RE.search(prediction or "")
    if m:
        return "\n" + m.group(1)
    return prediction or ""


def build_program(prediction: str, meta: dict[str, Any]) -> CodeTask:
    """The code task of one prediction; ``meta`` needs prompt, test and entry_point."""
    missing = [k for k in ("prompt", "test", "entry_point") if not meta.get(k)]
    if missing:
        raise ScoringError(f"code scoring: meta lacks {', '.join(missing)} (need prompt, test, entry_point)")
    return CodeTask(meta["prompt"], extract_completion(prediction), meta["test"], meta["entry_point"])


def to_score(result: SandboxResult) -> ScoreResult:
    """For code, ``extracted`` carries the run's outcome ("passed", "exception: ...", ...);
    ``error`` is set only when the sandbox itself could not run the program."""
    error = result.reason if result.reason.startswith("sandbox:") else None
    return ScoreResult(result.passed, result.reason, error)


def score_code(prediction: str, meta: dict[str, Any], *, timeout_s: float = 10.0) -> ScoreResult:
    return to_score(run_task(build_program(prediction, meta), timeout_s))


def score_code_many(predictions: Sequence[str], metas: Sequence[dict[str, Any]], *, timeout_s: float = 10.0,
                    workers: int | None = None) -> list[ScoreResult]:
    programs = [build_program(p, m) for p, m in zip(predictions, metas, strict=True)]
    return [to_score(r) for r in run_many(programs, timeout_s, workers)]
