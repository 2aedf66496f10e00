"""Shared result type and small LaTeX helpers used by several checkers."""

from __future__ import annotations

from dataclasses import dataclass

from components.errors import UserError


class ScoringError(UserError):
    """Bad scoring input: unknown answer type, malformed predictions file, unknown ids."""


@dataclass(frozen=True)
class ScoreResult:
    """Outcome of scoring one prediction.

    ``extracted`` is the canonical answer read from the prediction (None if none was found);
    ``error`` is set only when the *grader* failed (crash, timeout, sandbox problem, unusable
    gold answer); a wrong or missing answer is ``correct=False`` with ``error=None``, so that
    grading failures can be counted apart from model mistakes.
    """

    correct: bool
    extracted: str | None
    error: str | None


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` / ``\fbox{...}`` with balanced braces, else None.

    Hand-written because regexes cannot match nested braces (``\boxed{\frac{1}{2}}``).
    """
    best = None
    for marker in ("\\boxed", "\\fbox"):
        idx = text.rfind(marker)
        if idx >= 0 and (best is None or idx > best[0]):
            best = (idx, marker)
    if best is None:
        return None
    i = best[0] + len(best[1])
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # "\boxed 5" form: up to the next space or "$"
        j = i
        while j < len(text) and text[j] not in " $\n":
            j += 1
        return text[i:j] or None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


class Graded:
    """What a graded record answers from its ``grade`` (an Episode, or its compact EpisodeStats):
    correct (False until graded), the extracted answer and the grader's error."""

    grade: ScoreResult | None

    @property
    def correct(self) -> bool:
        return self.grade is not None and bool(self.grade.correct)

    @property
    def extracted(self) -> str | None:
        return None if self.grade is None else self.grade.extracted

    @property
    def score_error(self) -> str | None:
        return None if self.grade is None else self.grade.error
