"""Numeric extraction: priority rules, number formats, tolerance."""

from fractions import Fraction

import pytest
from helpers import grade_text

from components.scoring.numeric import canonical_number, extract_number, parse_number

CASES = [
    # (prediction, gold, expected canonical extraction)
    ("The answer is 1,450,000.", "1,450,000", "1450000"),
    ("Natalia sold 48 clips in April and 24 in May. #### 72", "72", "72"),
    ("First 3 apples, then 5. The answer is 8 apples, not 5.", "8", "8"),
    ("answer: -12", "-12", "-12"),
    ("So the total is \\boxed{\\frac{3}{4}}.", "0.75", "0.75"),
    ("It costs $1,200.50 in total", "1200.5", "1200.5"),
    ("The price fell to -$5 per share", "-5", "-5"),
    ("He walks 5 km every day", "5", "5"),
    ("The discount is 50%", "50", "50"),
    ("She ate 3/4 of the pie", "0.75", "0.75"),
    ("The answer is −7 degrees", "-7", "-7"),
    ("Final answer = €2,000", "2000", "2000"),
    ("The answer is 0.333333333", "1/3", "0.333333333"),
    ("8 - 3 = 5", "5", "5"),
    ("Total: 39.0", "39", "39"),
    ("#### 1,000,000\nThe answer is 12", "12", "12"),
    ("We get 2.50 dollars", "2.5", "2.5"),
    ("\\boxed{12} but earlier I wrote 7", "12", "12"),
    ("There are 12apples and 3 pears.\nThe answer is: 15", "15", "15"),
]


@pytest.mark.parametrize(("prediction", "gold", "extracted"), CASES)
def test_numeric_cases(prediction: str, gold: str, extracted: str) -> None:
    result = grade_text("numeric", prediction, gold)
    assert result.extracted == extracted
    assert result.correct, result
    assert result.error is None


def test_answer_phrase_beats_last_number() -> None:
    assert extract_number("The answer is 42. Check: 6 * 7 = 42, and 41 < 42 < 43") == 42


def test_hash_beats_boxed_and_last_number() -> None:
    assert extract_number("\\boxed{3} #### 9 and 10") == 9


def test_wrong_number_is_wrong_without_error() -> None:
    result = grade_text("numeric", "The answer is 71.", "72")
    assert (result.correct, result.extracted, result.error) == (False, "71", None)


def test_no_number() -> None:
    result = grade_text("numeric", "I don't know.", "72")
    assert result == type(result)(False, None, None)


def test_relative_tolerance() -> None:
    assert grade_text("numeric", "1000000.0005", "1000000").correct  # 5e-10 relative
    assert not grade_text("numeric", "1000.01", "1000").correct  # 1e-5 relative


def test_words_and_subtraction_are_not_negative() -> None:
    assert extract_number("costs 10 - 4") == 4  # binary minus after a number
    assert extract_number("x = -4") == -4


def test_bad_gold_reports_error() -> None:
    result = grade_text("numeric", "5", "five")
    assert not result.correct and "gold" in (result.error or "")


def test_parse_and_canonical() -> None:
    assert parse_number("1,450,000") == 1450000
    assert parse_number("39.0") == 39
    assert canonical_number(Fraction(1, 3)) == "1/3"
    assert canonical_number(Fraction(-5, 2)) == "-2.5"
