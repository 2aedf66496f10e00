"""Prompts are bounded before tokenising: an item whose prompt cannot fit the model's context is a
clear error (not a truncation, not an out-of-memory kill); a served request's refused values are
shown bounded in depth, so a deeply nested cell is a 400 naming its field."""

from __future__ import annotations

import pytest

from components.config import MasConfig
from components.data.item import Item
from components.mas.context import CHARS_PER_TOKEN, PromptBuilder, PromptTooLongError
from components.models.tiny import build_tiny_model, build_tiny_tokenizer
from components.tracking.served_inputs import RequestError, RequestLimits, request_items


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _counting(tok, seen: list[int]):
    encode = tok.encode

    def counted(text, *args, **kwargs):
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    return counted


def test_a_huge_task_is_refused_before_it_is_tokenised(tok, monkeypatch) -> None:
    seen: list[int] = []
    builder = PromptBuilder(tok, 256, max_frame_tokens=100)
    monkeypatch.setattr(builder.tok, "encode", _counting(tok, seen))
    with pytest.raises(PromptTooLongError, match=r"^item q1: its prompt has 50000003 characters, more than 16 per "
                                                 r"token of the 100 .*refused before tokenising"):
        builder.frame("sys", "7 " * 25_000_000, "item q1")
    assert seen == []  # nothing was tokenised


def test_a_task_over_the_token_room_is_refused_not_truncated(tok) -> None:
    builder = PromptBuilder(tok, 256, max_frame_tokens=100)
    assert builder.frame("sys", "What is 2+2?")  # fits
    question = "alpha beta gamma delta " * 60  # < 16 characters per token of room, > 100 tokens
    assert len(question) < 100 * CHARS_PER_TOKEN
    with pytest.raises(PromptTooLongError, match=r"^item q2: its prompt takes \d+ tokens, at most 100 fit"):
        builder.frame("sys", question, "item q2")
    assert PromptBuilder(tok, 256).frame("sys", question)  # unbounded builder (no window known): as before


def test_the_rollout_engine_refuses_a_50_mb_question_naming_the_item() -> None:
    from components.mas.calls import EngineOptions
    from components.mas.engine import RolloutEngine

    model, tok = build_tiny_model()
    engine = RolloutEngine(model, tok, MasConfig(agents=1, rounds=1, max_message_tokens=8),
                           options=EngineOptions(solo=True))
    assert engine.builder.max_frame_tokens == model.config.max_position_embeddings - 8
    big = Item(id="gsm8k/test/3", benchmark="gsm8k", question="7 " * 25_000_000, answer="1", answer_type="numeric")
    with pytest.raises(PromptTooLongError, match=r"^item gsm8k/test/3: its prompt has \d+ characters"):
        engine.rollout([big], 1, seed=0, greedy=True)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_deeply_nested_request_cell_is_refused_naming_its_field(tok) -> None:
    limits = RequestLimits(tok, MasConfig(agents=1, rounds=1, max_message_tokens=8), 2048)
    deep = _nested(5000)  # repr() of it raises RecursionError
    for row, field in (({"question": deep}, "'question'"), ({"question": "q", "answer_type": deep}, "answer_type"),
                       ({"question": "q", "answer_type": "choice", "choices": [deep]}, "'choices'")):
        with pytest.raises(RequestError, match=rf"^row 0: {field}") as err:
            request_items([row], limits)
        assert len(str(err.value)) < 300
    with pytest.raises(RequestError, match=r"^row 0: 'question' is too long: 5000000 characters, at most \d+ "):
        request_items([{"question": "x" * 5_000_000}], limits)  # characters first: never tokenised
    with pytest.raises(RequestError, match=r"^row 1: 'question' must be a non-empty string, got 7"):
        request_items([{"question": "q"}, {"question": 7}], limits)
