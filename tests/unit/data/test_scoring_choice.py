"""Multiple-choice letter extraction, incl. prose that starts with the article "A"."""

import pytest
from helpers import grade_text

from components.data.item import Item, ItemError
from components.scoring.choice import extract_choice

CHOICES = ["12", "15", "18", "21"]

CASES = [
    ("The answer is (C).", "C"),
    ("Therefore, the answer is C", "C"),
    ("answer is (c)", "C"),
    ("C)", "C"),
    ("(C)", "C"),
    ("I would go with Option C.", "C"),
    ("C.", "C"),
    ("Let me think step by step.\nThe sum is 18.\nC\n", "C"),
    ("B\nBecause 15 is the only multiple of 5.", "B"),
    ("**Answer:** D", "D"),
    ("\\boxed{D}", "D"),
    ("Answer: B) 15", "B"),
    ("Checking (A) 12: no. (B) 15: no. (C) 18: yes.", "C"),
    ("The correct option is B because 15 = 3 * 5.", "B"),
    ("A.", "A"),
]


@pytest.mark.parametrize(("prediction", "letter"), CASES)
def test_letter_cases(prediction: str, letter: str) -> None:
    assert extract_choice(prediction, CHOICES) == letter
    assert grade_text("choice", prediction, letter, {"choices": CHOICES}).correct


def test_article_a_in_prose_is_not_a_choice() -> None:
    text = "A train leaves the station at 5 pm. A car follows it."
    assert extract_choice(text) is None
    result = grade_text("choice", text, "A")
    assert not result.correct and result.extracted is None and result.error is None


def test_article_a_then_real_answer() -> None:
    assert extract_choice("A train leaves at 5. It covers 18 km.\nThe answer is (C).") == "C"


def test_lowercase_prose_after_answer_phrase() -> None:
    assert extract_choice("The answer is a bit unclear, maybe (B)") == "B"


def test_option_text_match_exactly_one() -> None:
    assert extract_choice("It must be 18", CHOICES) == "C"
    assert extract_choice("Either 12 or 15", CHOICES) is None  # two options mentioned
    assert extract_choice("Paris", ["London", "Paris", "Rome", "Berlin"]) == "B"


def test_aqua_prefixed_options() -> None:
    choices = ["A)125", "B)150", "C)225", "D)250", "E)275"]
    assert extract_choice("So the total is 225", choices) == "C"
    assert grade_text("choice", "The answer is E", "E", {"choices": choices}).correct


def test_letter_outside_choices_is_rejected() -> None:
    assert extract_choice("The answer is E", CHOICES) is None
    assert extract_choice("The answer is E") == "E"  # default A-E without choices


def test_wrong_letter() -> None:
    result = grade_text("choice", "The answer is (B)", "C", {"choices": CHOICES})
    assert (result.correct, result.extracted, result.error) == (False, "B", None)


def test_bad_gold_and_meta() -> None:
    assert grade_text("choice", "(A)", "Z").error
    with pytest.raises(ItemError, match="choices must be a list"):
        Item.from_record({"id": "x", "benchmark": "mmlu", "question": "q", "answer": "A", "answer_type": "choice",
                          "choices": "ABCD"})
