"""The typed item record: one benchmark question as every layer above the data layer sees it.

Prepared parquet stores the normalised record (``id, benchmark, split, question, choices, answer,
answer_type, meta``) with ``meta`` JSON-encoded; :meth:`Item.from_record` decodes it exactly once,
where the data is read (:func:`components.data.prepare.load_split`). The rollout engine, voting,
grading, the reward, evaluation and ``agent-gspo score`` all take ``Item`` objects, so an answer is
judged by the same rules everywhere (see :mod:`components.scoring.grader`).

``meta`` keys in use: ``subject``/``level`` (MMLU, MATH-500), ``prompt``/``test``/``entry_point``
(HumanEval), ``private`` (split-information items: the fact that only one agent is given).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, get_args

from components.errors import UserError

AnswerType = Literal["numeric", "choice", "math", "code"]
ANSWER_TYPES: tuple[str, ...] = get_args(AnswerType)
REQUIRED = ("id", "benchmark", "question", "answer", "answer_type")


class ItemError(UserError):
    """A record that cannot become an :class:`Item` (missing key, unknown answer type, bad meta)."""


@dataclass(frozen=True, eq=False)
class Item:
    """One question. Immutable; ``meta`` is a read-only mapping."""

    id: str
    benchmark: str
    question: str
    answer: str
    """canonical gold answer: a number, a letter, a LaTeX expression, or the reference solution (code)"""
    answer_type: AnswerType
    split: str = ""
    choices: tuple[str, ...] | None = None
    """option texts for choice items (A, B, ... in order), else None"""
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def private_fact(self) -> str | None:
        """The fact one agent alone is given on split-information items (else None)."""
        fact = self.meta.get("private")
        return str(fact) if fact else None

    @classmethod
    def from_record(cls, row: Mapping[str, Any], where: str = "record") -> Item:
        """Build from a normalised record (``meta`` a dict or its JSON string); errors name ``where``."""
        if isinstance(row, Item):
            return row
        missing = [k for k in REQUIRED if row.get(k) is None]
        if missing:
            raise ItemError(f"{where} (id={row.get('id')!r}) lacks key(s) {missing}")
        if row["answer_type"] not in ANSWER_TYPES:
            raise ItemError(f"{where} (id={row['id']!r}): answer_type {row['answer_type']!r} is not one of "
                            f"{', '.join(ANSWER_TYPES)}")
        meta = row.get("meta") or {}
        if isinstance(meta, str):
            try:
                meta = json.loads(meta) if meta.strip() else {}
            except json.JSONDecodeError as exc:
                raise ItemError(f"{where} (id={row['id']!r}): meta is not valid JSON ({exc.msg})") from None
        if not isinstance(meta, Mapping):
            raise ItemError(f"{where} (id={row['id']!r}): meta must be a mapping, got {type(meta).__name__}")
        choices = row.get("choices")
        if choices is not None and (isinstance(choices, str) or not hasattr(choices, "__iter__")):
            raise ItemError(f"{where} (id={row['id']!r}): choices must be a list of strings")
        return cls(id=str(row["id"]), benchmark=str(row["benchmark"]), question=str(row["question"]),
                   answer=str(row["answer"]), answer_type=row["answer_type"], split=str(row.get("split") or ""),
                   choices=None if choices is None else tuple(str(c) for c in choices),
                   meta=MappingProxyType(dict(meta)))

    def to_record(self) -> dict[str, Any]:
        """The normalised record with ``meta`` as a plain dict (parquet encodes it as JSON)."""
        return {"id": self.id, "benchmark": self.benchmark, "split": self.split, "question": self.question,
                "choices": None if self.choices is None else list(self.choices), "answer": self.answer,
                "answer_type": self.answer_type, "meta": dict(self.meta)}


def as_items(rows: list[Any], where: str = "items") -> list[Item]:
    """``Item`` objects from records or items (records are validated; errors name the row)."""
    return [Item.from_record(r, f"{where}[{k}]") for k, r in enumerate(rows)]
