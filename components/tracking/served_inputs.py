"""Checks of a served request, done before any generation: every refusal names its field or param.

What a request costs (memory, time) grows with what it asks for, so every input is bounded up
front; :class:`RequestError` becomes HTTP 400 when served (:mod:`components.tracking.hf_pyfunc`).

* rows: at most :data:`MAX_ROWS` per request, sent as objects (``dataframe_records``, ``inputs`` /
  ``instances`` as a list, ``dataframe_split``) or as columns (``inputs`` / ``instances`` as
  ``{"question": [...], ...}``); :func:`request_rows` reads the columns MLflow delivers as one row.
* ``question``: a non-empty string. Null / NaN are refused; MLflow hands a JSON null of the
  ``inputs`` format over as the text ``'None'`` (NaN as ``'nan'``), so those texts are refused
  too. It must fit the model with the rest of the prompt: at most
  ``window - frame - messages - max_new_tokens`` tokens, where ``window`` is the model's context
  length (``max_position_embeddings``), ``frame`` the longest agent prompt around the question
  (system prompt, chat template, options) and ``messages`` the room earlier messages may take
  (``mas.context_tokens``, or less when the team cannot say that much). A question of more than
  :data:`CHARS_PER_TOKEN` characters per token of that room is refused before it is tokenised.
  A model that declares no context length bounds the question by ``mas.context_tokens`` tokens.
* ``answer_type``: one of :data:`ANSWER_TYPES` (absent / null: ``math``).
* ``choices``: 1..:data:`MAX_CHOICES` non-empty strings (the prompt letters them A..J); required
  by ``answer_type`` ``choice``.
* params: ``agents``, ``rounds``, ``temperature`` as the config schema bounds them;
  ``max_new_tokens`` from 1 to what leaves :data:`MIN_QUESTION_TOKENS` of the window for the
  question (``mas.context_tokens`` when the model declares no window); ``seed`` in 0..2**32-1.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from typing import Any

import numpy as np

from components.config import MasConfig
from components.data.item import Item
from components.mas.context import CHARS_PER_TOKEN, WINDOW_KEYS, PromptBuilder, model_window  # noqa: F401
from components.mas.roles import DECIDER, role_names, system_prompt, task_family, user_prompt

ANSWER_TYPES = ("math", "numeric", "choice", "code")
DEFAULT_ANSWER_TYPE = "math"
MAX_ROWS = 64
"""rows per request: the rows of a request are answered in one batched rollout"""
MAX_CHOICES = 10
"""options of a choice question: the prompt letters them A..J (components.mas.roles.user_prompt)"""
SEED_MAX = 2**32 - 1
"""as the config schema bounds seeds (what numpy, torch and Python's random all accept)"""
MIN_QUESTION_TOKENS = 16
"""room ``max_new_tokens`` must leave for the question"""
BOUNDARY_TOKENS = 8
"""margin for tokens merged across the question's edges in the rendered prompt"""
NULL_TEXTS = frozenset({"none", "nan", "null"})
"""how MLflow renders a JSON null / NaN cell of a string column (``inputs`` format)"""


COLUMNAR_FORM = '{"question": [...], "answer_type": [...], "choices": [...]}'
ROW_FORMS = ('one object per row ({"dataframe_records": [{"question": ...}, ...]}, {"inputs": [{"question": ...}, '
             '...]} or dataframe_split)')
"""the request forms a refusal of a columnar request points to"""


class RequestError(ValueError):
    """A request the served system cannot answer; the message names the field or param."""


_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 3, 60, 60, 4, 4
"""shows a refused value bounded in depth and size: a cell nested a thousand deep (MLflow's JSON
parser lets ~990 levels through) made ``repr`` itself fail with RecursionError"""


def _short(value: Any, width: int = 60) -> str:
    text = repr(value) if isinstance(value, str) else _REPR.repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} chars)"


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def check_seed(value: Any) -> int:
    """An integer in 0..:data:`SEED_MAX`; absent / null: 0."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= SEED_MAX:
        raise RequestError(f"invalid params: seed={_short(value)}: must be an integer in 0..{SEED_MAX}")
    return int(value)


def check_temperature(value: Any) -> float:
    """A finite number (absent / null: 0); its range (0..2) is the config schema's (``mas.temperature``)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise RequestError(f"invalid params: temperature={_short(value)}: must be a number in 0..2 (0 = greedy)")
    return float(value)


class RequestLimits:
    """The token room of one request's settings (``mas`` with the params applied) on this model."""

    def __init__(self, tokenizer: Any, mas: MasConfig, window: int | None):
        self.tok, self.mas, self.window = tokenizer, mas, window
        self.builder = PromptBuilder(tokenizer, mas.context_tokens)
        self._frames: dict[tuple[str, tuple[str, ...] | None], int] = {}
        self.reply = mas.max_message_tokens
        header = max(len(self.builder.header(mas.agents - 1, role, mas.rounds - 1))
                     for role in set(role_names(mas.agents)))
        # every block a prompt may hold is a header + one message; their sum is cut to context_tokens
        self.messages = min(mas.context_tokens, mas.agents * mas.rounds * (self.reply + header))

    def frame(self, answer_type: str, choices: tuple[str, ...] | None = None) -> int:
        """Tokens of the longest agent prompt of a question of this kind, the question itself left out."""
        key = (answer_type, choices)
        if key not in self._frames:
            n = self.mas.agents
            item = Item(id="size", benchmark="request", question="", answer="", answer_type=answer_type,
                        choices=choices)
            family, user, team = task_family(answer_type), user_prompt(item), 1 if n == 1 else n
            # as the rollout engine prompts them: every agent, and the decider when it aggregates
            systems = {system_prompt(family, role, a, team, allow_silence=n > 1)
                       for a, role in enumerate(role_names(n))}
            if self.mas.aggregation == "decision_agent":
                systems.add(system_prompt(family, DECIDER, n, team, allow_silence=n > 1))
            longest = max(len(f.prefix) + len(f.suffix) for f in (self.builder.frame(s, user) for s in systems))
            self._frames[key] = longest + len(self.builder.intro) + len(self.builder.outro) + BOUNDARY_TOKENS
        return self._frames[key]

    def room(self, frame: int) -> int:
        """Tokens left for the question around a prompt frame of ``frame`` tokens."""
        if self.window is None:
            return self.mas.context_tokens
        return self.window - frame - self.messages - self.reply

    def _holds(self, frame: int) -> str:
        if self.window is None:
            return "the model declares no context length; bounded by mas.context_tokens"
        return (f"the model holds {self.window} tokens: the agent prompt takes {frame}, earlier messages up to "
                f"{self.messages} (mas.context_tokens={self.mas.context_tokens}) and the reply max_new_tokens="
                f"{self.reply}")

    def check_reply(self) -> None:
        """``max_new_tokens`` must leave :data:`MIN_QUESTION_TOKENS` for the question."""
        if self.window is None:
            limit, why = self.mas.context_tokens, "the model declares no context length; bounded by mas.context_tokens"
        else:
            frame = self.frame(DEFAULT_ANSWER_TYPE)
            limit = self.window - frame - self.messages - MIN_QUESTION_TOKENS
            why = (f"the model holds {self.window} tokens: the agent prompt takes {frame}, earlier messages up to "
                   f"{self.messages} (mas.context_tokens={self.mas.context_tokens}) and the question at least "
                   f"{MIN_QUESTION_TOKENS}")
        if self.reply > limit:
            raise RequestError(f"invalid params: max_new_tokens={self.reply}: at most {max(limit, 0)} ({why})")

    def count(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False, verbose=False)["input_ids"])

    def check_question(self, k: int, question: str, kind: str, choices: tuple[str, ...] | None) -> None:
        """Refuse a question that does not fit: by characters first (cheap), then by tokens."""
        chars_room = max(self.room(self.frame(kind)), 0) * CHARS_PER_TOKEN
        if len(question) > chars_room:
            raise RequestError(f"row {k}: 'question' is too long: {len(question)} characters, at most {chars_room} "
                               f"({CHARS_PER_TOKEN} per token of room; {self._holds(self.frame(kind))})")
        if choices and len(question) + sum(map(len, choices)) > chars_room:
            raise RequestError(f"row {k}: 'choices' are too long: {sum(map(len, choices))} characters with a "
                               f"{len(question)}-character question, at most {chars_room} in all")
        frame = self.frame(kind, choices)
        room, tokens = self.room(frame), self.count(question)
        if tokens > room:
            what = "'question' (with its choices)" if choices else "'question'"
            raise RequestError(f"row {k}: {what} is too long: {tokens} tokens, at most {max(room, 0)} fit "
                               f"({self._holds(frame)})")


def _choices(k: int, value: Any) -> tuple[str, ...] | None:
    if _is_null(value):
        return None
    if isinstance(value, np.ndarray) and value.ndim != 1 or isinstance(value, (str, bytes)) or not isinstance(
            value, (list, tuple, np.ndarray)):
        raise RequestError(f"row {k}: 'choices' must be a list of strings, got {_short(value)}")
    if len(value) > MAX_CHOICES:
        raise RequestError(f"row {k}: 'choices' has {len(value)} options, at most {MAX_CHOICES} (lettered A..J)")
    for i, c in enumerate(value):
        if not isinstance(c, str) or not c.strip():
            raise RequestError(f"row {k}: 'choices'[{i}] must be a non-empty string, got {_short(c)}")
    return tuple(str(c) for c in value)


def _question(k: int, value: Any) -> str:
    if isinstance(value, str) and value.strip() and value.strip().lower() not in NULL_TEXTS:
        return str(value)
    if _is_null(value):
        got = "null"
    elif isinstance(value, str) and value.strip():  # MLflow's rendering of a JSON null / NaN
        got = f"{_short(value)} (MLflow passes a JSON null as the text 'None'; refused as null)"
    else:
        got = _short(value)
    raise RequestError(f"row {k}: 'question' must be a non-empty string, got {got}")


def _check_rows(n: int) -> None:
    if n > MAX_ROWS:
        raise RequestError(f"inputs: {n} rows in one request, at most {MAX_ROWS} (send several requests)")


def _is_column(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or isinstance(value, np.ndarray) and value.ndim >= 1


def _cells(row: dict[str, Any]) -> dict[str, Any]:
    return {k: None if _is_null(v) else v for k, v in row.items()}


def request_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's rows from the rows of the frame MLflow hands ``predict`` (NaN / None cells: None).

    MLflow makes a dict of columns whose values are all lists of strings (``{"inputs": {"question":
    [q1, q2]}}``, the same under ``instances``, or ``predict({"question": [...]})``) ONE row whose
    cells are those lists; other dicts of columns it makes one row per element. A single row whose
    ``question`` is a list is therefore read as columns, one question per element, and every other
    field must then be a list of as many values (null where a row has none). A question is a
    string, so a list question has no other meaning; a request of several rows keeps its rows.
    """
    if len(rows) != 1 or not _is_column(rows[0].get("question")):
        return [_cells(row) for row in rows]
    columns = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in rows[0].items()}
    n = len(columns["question"])
    _check_rows(n)
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, values in columns.items():
        if _is_null(values):
            values = [None] * n
        elif not _is_column(values) or len(values) != n:
            got = f"a list of {len(values)}" if _is_column(values) else _short(values)
            raise RequestError(f"inputs: 'question' is a list of {n}, read as columns {COLUMNAR_FORM}, but {key!r} is "
                               f"{got}: give every field as a list of {n} values, one per question (null for none), "
                               f"or send {ROW_FORMS}")
        for row, value in zip(out, values, strict=True):
            row[key] = value
    return [_cells(row) for row in out]


def request_items(records: list[dict[str, Any]], limits: RequestLimits) -> list[Item]:
    """Engine items from request rows (``question``, ``answer_type``?, ``choices``?), all checked first."""
    _check_rows(len(records))
    items = []
    for k, row in enumerate(records):
        question = _question(k, row.get("question"))
        kind = row.get("answer_type")
        if _is_null(kind) or (isinstance(kind, str) and kind.strip().lower() in NULL_TEXTS | {""}):
            kind = DEFAULT_ANSWER_TYPE
        if not isinstance(kind, str) or kind not in ANSWER_TYPES:
            raise RequestError(f"row {k}: answer_type {_short(kind)} is not one of {', '.join(ANSWER_TYPES)}")
        kind = str(kind)
        choices = _choices(k, row.get("choices"))
        if kind == "choice" and not choices:
            raise RequestError(f"row {k}: answer_type 'choice' needs 'choices' (the option texts, A first)")
        limits.check_question(k, question, kind, choices if kind == "choice" else None)
        items.append(Item(id=f"request-{k}", benchmark="request", question=question, answer="",
                          answer_type=kind, choices=choices))
    return items
