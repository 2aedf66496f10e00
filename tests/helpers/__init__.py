"""Helpers shared by the tests (importable as ``helpers``: pyproject sets pytest's pythonpath)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.data.item import Item
from components.scoring.grader import grade_many
from components.scoring.result import ScoreResult


def make_item(answer_type: str, gold: str, meta: Mapping[str, Any] | None = None, *, item_id: str = "t/0",
              benchmark: str = "test") -> Item:
    """An item for grading tests; ``meta["choices"]`` (if given) becomes the item's options."""
    meta = dict(meta or {})
    choices = meta.pop("choices", None)
    return Item(id=item_id, benchmark=benchmark, question="q", answer=str(gold), answer_type=answer_type,  # type: ignore[arg-type]
                choices=None if choices is None else tuple(choices), meta=meta)


def grade_text(answer_type: str, text: str, gold: str, meta: Mapping[str, Any] | None = None) -> ScoreResult:
    """The one grader on one text (answer type, gold answer and meta as a record would give them)."""
    return grade_many([(make_item(answer_type, gold, meta), text)])[0]


def grade_rows(rows: Sequence[tuple[str, str, str, Mapping[str, Any]]], **kw: Any) -> list[ScoreResult]:
    """The one grader on ``(answer_type, text, gold, meta)`` rows, in one batch."""
    return grade_many([(make_item(t, g, m, item_id=f"t/{k}"), p) for k, (t, p, g, m) in enumerate(rows)], **kw)
