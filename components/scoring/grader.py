"""One grader for every path that judges an answer: voting, the training reward, evaluation and
``agent-gspo score`` all call :func:`extract` / :func:`grade_many` with the same :class:`Item`.

* :func:`extract` reads the answer a text gives, without looking at the gold answer: the vote key
  of a message (a canonical number, an option letter — option texts matched against the item's
  ``choices`` —, a LaTeX expression, or for code the program that would be run).
* :func:`grade` / :func:`grade_many` check that answer against the gold one. For numeric, choice
  and maths items ``grade(item, text).extracted == extract(item, text)`` by construction (a test
  holds every path to it); for code ``extracted`` is the sandbox's outcome ("passed",
  "exception: ...") because the program itself would not fit a results line.

Maths equivalence runs in the bounded math-verify process pool and programs in the sandbox (see
``math_grader`` and ``sandbox``); :func:`grade_many` runs both in parallel for a batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from components.data.item import Item
from components.scoring.choice import extract_choice, score_choice
from components.scoring.code import extract_completion, score_code_many
from components.scoring.math_grader import extract_math_answer, get_pool, score_math
from components.scoring.numeric import canonical_number, extract_number, score_numeric
from components.scoring.result import ScoreResult, ScoringError


def extract(item: Item, text: str) -> str | None:
    """The answer ``text`` gives for ``item`` (None when it gives none); never uses the gold answer."""
    text = text or ""
    kind = item.answer_type
    if kind == "numeric":
        value = extract_number(text)
        return None if value is None else canonical_number(value)
    if kind == "choice":
        return extract_choice(text, list(item.choices) if item.choices else None)
    if kind == "math":
        return extract_math_answer(text)
    if kind == "code":
        program = extract_completion(text).strip()
        return program or None
    raise ScoringError(f"item {item.id!r}: unknown answer_type {kind!r}")


def _check(item: Item, text: str, timeout_s: float) -> ScoreResult:
    """Numeric, choice and maths checkers; each reads the answer exactly as :func:`extract` does."""
    if item.answer_type == "numeric":
        return score_numeric(text, item.answer)
    if item.answer_type == "choice":
        return score_choice(text, item.answer, {"choices": list(item.choices)} if item.choices else None)
    if item.answer_type == "math":
        return score_math(text, item.answer, timeout_s=timeout_s)
    raise ScoringError(f"item {item.id!r}: unknown answer_type {item.answer_type!r}")


def grade(item: Item, text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    """Judge one text against ``item``'s gold answer (see the module docstring)."""
    return grade_many([(item, text)], timeout_s=timeout_s)[0]


def grade_many(pairs: Sequence[tuple[Item, str]], *, timeout_s: float = 10.0,
               workers: int | None = None) -> list[ScoreResult]:
    """Judge ``(item, text)`` pairs; results in input order. Programs run in parallel sandboxes
    (``workers``, default the core count) and maths in the math-verify pool; the rest inline."""
    n_workers = max(1, workers or os.cpu_count() or 1)
    for k, pair in enumerate(pairs):
        if len(pair) != 2 or not isinstance(pair[0], Item):
            raise ScoringError(f"grade_many: pair {k} must be (Item, text), got {pair!r:.200}")
    results: list[ScoreResult | None] = [None] * len(pairs)
    code = [k for k, (item, _) in enumerate(pairs) if item.answer_type == "code"]
    if code:
        metas = [dict(pairs[k][0].meta) for k in code]
        scored = score_code_many([pairs[k][1] or "" for k in code], metas, timeout_s=timeout_s, workers=n_workers)
        for k, res in zip(code, scored, strict=True):
            results[k] = res
    maths = [k for k, (item, _) in enumerate(pairs) if item.answer_type == "math"]
    if maths:
        pool = get_pool(n_workers)
        with ThreadPoolExecutor(max_workers=pool.max_workers) as ex:
            for k, res in zip(maths, ex.map(lambda k: _check(pairs[k][0], pairs[k][1] or "", timeout_s), maths),
                              strict=True):
                results[k] = res
    for k, (item, text) in enumerate(pairs):
        if results[k] is None:
            results[k] = _check(item, text or "", timeout_s)
    return [r for r in results if r is not None]
