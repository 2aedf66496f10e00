"""Every bad request to the served system is refused up front, quickly, with a message naming its field.

The served system is the tiny random ChatML policy (``model.name: tiny-random``, a 2048-token
window) with recorded settings of 2 agents x 2 rounds and 4-token messages, called in-process
(:meth:`ServedSystem.answer`, what ``mlflow models serve`` runs per request). Generation is
replaced by a tripwire for the refusals: none of them may reach the policy. A normal request
still gets its answer from the real policy.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.paths import load_test_module

import components.tracking.served as served_mod
from components.tracking.served import ServedSystem
from components.tracking.served_inputs import (
    MAX_CHOICES,
    MAX_ROWS,
    SEED_MAX,
    RequestError,
    RequestLimits,
    request_rows,
)

test_tracking_helpers = load_test_module("test_tracking_helpers")

OK = {"question": "What is 2 + 3?"}
BIG = "What is 2+3? " * 800_000  # ~10 MB, as the hostile request sent


@pytest.fixture(scope="module")
def system() -> ServedSystem:
    from components.models.tiny import build_tiny_model

    model, tokenizer = build_tiny_model()
    return ServedSystem(model, tokenizer, test_tracking_helpers.system_settings())


@pytest.fixture()
def no_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(*args, **kwargs):
        raise AssertionError("a refused request reached generation")

    monkeypatch.setattr(served_mod, "run_rollout", tripwire)


def refused(system: ServedSystem, rows: list[dict], params: dict | None = None) -> str:
    t0 = time.perf_counter()
    with pytest.raises(RequestError) as info:
        system.answer(rows, params)
    assert time.perf_counter() - t0 < 5.0
    message = str(info.value)
    assert len(message) < 600, message  # the bad value is quoted short, never echoed whole
    return message


@pytest.mark.usefixtures("no_generation")
def test_huge_question_is_refused_by_characters_before_tokenising(system: ServedSystem,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tokenising(self, text):
        raise AssertionError("a 10 MB question was tokenised")

    monkeypatch.setattr(RequestLimits, "count", no_tokenising)
    message = refused(system, [{"question": BIG}])
    assert message.startswith("row 0: 'question' is too long: 10400000 characters"), message


@pytest.mark.usefixtures("no_generation")
def test_question_longer_than_the_model_holds_is_refused_in_tokens(system: ServedSystem) -> None:
    assert system.window == 2048
    message = refused(system, [{"question": "What is 2+3? " * 300}])  # ~4 kB: under the character bound
    m = re.match(r"row 0: 'question' is too long: (\d+) tokens, at most (\d+) fit \(the model holds 2048 ", message)
    assert m and int(m[1]) > int(m[2]) > 1000, message
    assert "max_new_tokens=4" in message
    # a longer reply leaves less room for the question
    m2 = re.search(r"at most (\d+) fit", refused(system, [{"question": "What is 2+3? " * 300}], {"max_new_tokens": 64}))
    assert int(m2[1]) == int(m[2]) - 60 - 4 * 60  # 60 more reply tokens, and 4 messages that may each be 60 longer


@pytest.mark.usefixtures("no_generation")
def test_max_new_tokens_has_an_upper_bound(system: ServedSystem) -> None:
    message = refused(system, [OK], {"max_new_tokens": 30_000})  # within the schema's 32768, beyond the window
    m = re.match(r"invalid params: max_new_tokens=30000: at most (\d+) \(the model holds 2048 tokens", message)
    assert m, message
    limit = int(m[1])
    assert 16 < limit < 2048
    assert system.mas_for({"max_new_tokens": limit})[0].max_message_tokens == limit  # the bound itself is allowed
    refused(system, [OK], {"max_new_tokens": limit + 1})
    assert refused(system, [OK], {"max_new_tokens": 0}).startswith("invalid params: max_new_tokens=0")
    assert refused(system, [OK], {"max_new_tokens": 10**9}).startswith(
        "invalid params: max_new_tokens=1000000000: Input should be less than or equal to 32768")


@pytest.mark.usefixtures("no_generation")
@pytest.mark.parametrize("seed", [99999999999999999999, SEED_MAX + 1, -1, 1.5, "7", True, float("nan")])
def test_seed_outside_the_config_range_is_refused(system: ServedSystem, seed) -> None:
    message = refused(system, [OK], {"seed": seed})
    assert message.startswith(f"invalid params: seed={seed!r}: must be an integer in 0..4294967295"), message


def test_seed_range_ends_are_accepted(system: ServedSystem) -> None:
    assert system.mas_for({"seed": SEED_MAX})[2] == SEED_MAX
    assert system.mas_for({"seed": None})[2] == 0


@pytest.mark.usefixtures("no_generation")
@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), "abc", 5.0, -1.0])
def test_bad_temperature_is_refused(system: ServedSystem, temperature) -> None:
    message = refused(system, [OK], {"temperature": temperature})
    assert message.startswith(f"invalid params: temperature={temperature!r}"), message


@pytest.mark.usefixtures("no_generation")
@pytest.mark.parametrize("question", [None, float("nan"), "None", "nan", " null ", "", "   ", 5, ["What is 2 + 3?"]])
def test_null_or_non_string_question_is_refused(system: ServedSystem, question) -> None:
    message = refused(system, [{"question": question}])
    assert message.startswith("row 0: 'question' must be a non-empty string, got "), message


@pytest.mark.usefixtures("no_generation")
@pytest.mark.parametrize(("row", "named"), [
    ({"answer_type": "essay" * 10_000}, r"row 0: answer_type 'essayessay.*\.\.\. \(50002 chars\) is not one of"),
    ({"answer_type": 3}, r"row 0: answer_type 3 is not one of"),
    ({"answer_type": "choice"}, r"row 0: answer_type 'choice' needs 'choices'"),
    ({"answer_type": "choice", "choices": []}, r"row 0: answer_type 'choice' needs 'choices'"),
    ({"answer_type": "choice", "choices": [str(i) for i in range(MAX_CHOICES + 1)]},
     r"row 0: 'choices' has 11 options, at most 10"),
    ({"answer_type": "choice", "choices": "ABCD"}, r"row 0: 'choices' must be a list of strings, got 'ABCD'"),
    ({"answer_type": "choice", "choices": ["4", None]}, r"row 0: 'choices'\[1\] must be a non-empty string, got None"),
    ({"answer_type": "choice", "choices": ["4", "5" * 10_000_000]}, r"row 0: 'choices' are too long: 10000001 char"),
    ({"answer_type": "choice", "choices": ["4", "5 " * 2_000]}, r"row 0: 'question' \(with its choices\) is too long"),
])
def test_bad_answer_type_or_choices_are_refused(system: ServedSystem, row: dict, named: str) -> None:
    assert re.match(named, refused(system, [OK | row])), refused(system, [OK | row])


@pytest.mark.usefixtures("no_generation")
def test_rows_per_request_are_bounded_and_every_row_is_checked_first(system: ServedSystem) -> None:
    assert refused(system, [OK] * (MAX_ROWS + 1)).startswith(f"inputs: {MAX_ROWS + 1} rows in one request, at most")
    assert refused(system, [OK, OK, {"question": None}]).startswith("row 2: 'question'")


@pytest.mark.usefixtures("no_generation")
def test_model_without_a_declared_window_is_bounded_by_context_tokens(system: ServedSystem,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.tokenizer, "model_max_length", int(1e30))  # transformers' "unset" sentinel
    bare = ServedSystem(SimpleNamespace(), system.tokenizer,  # a model with no config at all
                        test_tracking_helpers.system_settings("mas.context_tokens=64"))
    assert bare.window is None
    assert refused(bare, [OK], {"max_new_tokens": 65}).startswith(
        "invalid params: max_new_tokens=65: at most 64 (the model declares no context length")
    assert re.match(r"row 0: 'question' is too long: \d+ tokens, at most 64 fit",
                    refused(bare, [{"question": "What is 2+3? " * 30}]))


def test_normal_requests_still_answer(system: ServedSystem) -> None:
    (answer,) = system.answer([OK])
    assert [(m["agent"], m["round"]) for m in answer["transcript"]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    rows = [{"question": "Pick one", "answer_type": "choice", "choices": ["1", "2"]},
            {"question": "What is 1 + 1?", "answer_type": None, "choices": None}]  # null: the defaults
    answers = system.answer(rows, {"agents": 3, "rounds": 1, "max_new_tokens": 2, "seed": SEED_MAX,
                                   "temperature": 0.7})
    assert [len(a["transcript"]) for a in answers] == [3, 3]
    assert all(m["completion_tokens"] <= 2 for a in answers for m in a["transcript"])
    assert system.answer([{"question": "What is 2+3? " * 100}])[0]["prompt_tokens"] > 0  # long but fits


COLUMNS = {"question": ["What is 2 + 3?", "Pick one"], "answer_type": [None, "choice"],
           "choices": [None, ["1", "2", "3"]]}
ROWS = [{"question": "What is 2 + 3?", "answer_type": None, "choices": None},
        {"question": "Pick one", "answer_type": "choice", "choices": ["1", "2", "3"]}]


@pytest.mark.parametrize("columns", [
    COLUMNS,  # {"inputs": {...}}: MLflow's one row of lists
    {"question": np.array(COLUMNS["question"]), "answer_type": np.array(["None", "choice"]),
     "choices": COLUMNS["choices"]},  # as numpy arrays, a JSON null as the text 'None' (MLflow's string columns)
])
def test_columns_mlflow_hands_over_as_one_row_are_read_as_rows(columns: dict) -> None:
    rows = request_rows([columns])
    assert [r["question"] for r in rows] == COLUMNS["question"] and type(rows[0]["question"]) is str
    assert [r["choices"] for r in rows] == COLUMNS["choices"]
    assert request_rows([{"question": ["q"], "choices": float("nan")}]) == [{"question": "q", "choices": None}]
    assert request_rows([{"question": []}]) == []


def test_rows_are_kept_as_sent_with_nan_cells_as_none() -> None:
    assert request_rows(ROWS) == ROWS
    assert request_rows([{"question": "q", "choices": float("nan")}]) == [{"question": "q", "choices": None}]
    several = [{"question": ["a", "b"]}, {"question": "c"}]  # several rows: a list question stays one (refused)
    assert request_rows(several) == several


@pytest.mark.parametrize(("extra", "got"), [({"answer_type": ["math"]}, "'answer_type' is a list of 1"),
                                            ({"answer_type": "math"}, "'answer_type' is 'math'"),
                                            ({"choices": ["1", "2"]}, None)])
def test_columns_of_other_lengths_are_refused_naming_the_field_and_the_forms(extra: dict, got: str | None) -> None:
    rows = [{"question": ["q1", "q2", "q3"]} | extra]
    with pytest.raises(RequestError) as info:
        request_rows(rows)
    message = str(info.value)
    assert message.startswith("inputs: 'question' is a list of 3, read as columns {\"question\": [...]"), message
    assert (got or "'choices' is a list of 2") in message and "dataframe_records" in message and len(message) < 600


def test_columns_are_bounded_before_they_become_rows() -> None:
    with pytest.raises(RequestError, match=f"inputs: {MAX_ROWS + 1} rows in one request"):
        request_rows([{"question": ["q"] * (MAX_ROWS + 1), "choices": None}])


@pytest.mark.usefixtures("no_generation")
def test_non_strings_in_a_question_column_are_refused_naming_the_row(system: ServedSystem) -> None:
    for value in (123, True, {"a": 1}, None):
        rows = request_rows([{"question": ["What is 2 + 3?", value]}])
        assert refused(system, rows).startswith("row 1: 'question' must be a non-empty string, got "), value
