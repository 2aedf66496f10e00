r"""Numeric answers (GSM8K, MultiArith, SVAMP): extract a number from free text, compare as numbers.

Extraction priority (the first rule that finds a number wins; within a rule the *last*
occurrence wins, because models restate the question's numbers before concluding):

1. "the answer is X" / "answer: X" / "final answer = X"
2. ``#### X`` (GSM8K's own format)
3. ``\boxed{X}``
4. the last number in the text.

Numbers may carry thousands commas (``1,450,000``), a sign (``-3``, ``−3``), decimals,
simple fractions (``3/4``, ``\frac{3}{4}``), currency (``$1,200.50``, ``€5``, ``-$5``) and units
or percent after them (``12 apples``, ``5 km``, ``50%`` -> 50). Values are kept as exact
``Fraction`` and compared with a relative tolerance of 1e-6.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

from components.scoring.result import ScoreResult, last_boxed

_NUM = (
    r"(?P<sign>[-−–+]?)(?:(?:[$€£¥]|\\\$)\s*(?P<sign2>[-−]?))?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?)(?![\d.]))?"
)
_NUM_RE = re.compile(r"(?<![\w.,])" + _NUM)
_ANSWER_RE = re.compile(r"answer\s*(?:is|:|=|was)\s*:?\s*(?:of\s+|approximately\s+|about\s+|=\s*)?", re.I)
_HASH_RE = re.compile(r"####\s*")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}|\\[dt]?frac(\d)(\d)")
_LATEX_DROP = re.compile(r"\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\(?:left|right|,|!|;|quad)|\{,\}|\\%|%")


def _to_fraction(m: re.Match[str]) -> Fraction | None:
    """Value of a ``_NUM_RE`` match; a minus right after a number ("8 - 3") is subtraction."""
    before = m.string[: m.start()].rstrip()
    binary = bool(before) and (before[-1].isdigit() or before[-1] == ")")
    try:
        value = Fraction(m.group("int").replace(",", ""))
        if m.group("den"):
            den = Fraction(m.group("den"))
            if den == 0:
                return None
            value /= den
    except (ValueError, ZeroDivisionError):
        return None
    if (m.group("sign") in ("-", "−", "–") and not binary) or m.group("sign2") in ("-", "−"):
        value = -value
    return value


def _first_number(text: str) -> Fraction | None:
    m = _NUM_RE.search(text)
    return _to_fraction(m) if m else None


def _last_number(text: str) -> Fraction | None:
    last = None
    for m in _NUM_RE.finditer(text):
        last = m
    return _to_fraction(last) if last else None


def _delatex(text: str) -> str:
    text = _FRAC_RE.sub(lambda m: f"{m.group(1) or m.group(3)}/{m.group(2) or m.group(4)}", text)
    return _LATEX_DROP.sub("", text).replace("{", "").replace("}", "")


def parse_number(text: str) -> Fraction | None:
    """Parse a gold/canonical answer ("1,450,000", "39.0", "-3", "3/4", "$5") to a Fraction."""
    return _first_number(_delatex(str(text).strip()))


def canonical_number(value: Fraction) -> str:
    """Shortest exact decimal string ("1450000", "0.75", "-2.5"); "a/b" when not a finite decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    dec = Decimal(value.numerator) / Decimal(value.denominator)
    text = format(dec.normalize(), "f")
    return text


def extract_number(prediction: str) -> Fraction | None:
    """Apply the priority list from the module docstring; None when the text has no number."""
    text = prediction or ""
    for pattern in (_ANSWER_RE, _HASH_RE):
        for m in reversed(list(pattern.finditer(text))):
            tail = text[m.end() : m.end() + 80].split("\n", 1)[0]
            value = _first_number(_delatex(tail))
            if value is not None:
                return value
    boxed = last_boxed(text)
    if boxed is not None:
        value = _first_number(_delatex(boxed))
        if value is not None:
            return value
    return _last_number(_delatex(text))


def numbers_equal(a: Fraction, b: Fraction, rel_tol: float = 1e-6) -> bool:
    """Exact match, or within ``rel_tol`` relative (abs 1e-9 near zero): :func:`math.isclose`'s rule,
    computed on the exact fractions (a number of 309+ digits has no float: ``float()`` overflowed)."""
    if a == b:
        return True
    tolerance = max(Fraction(rel_tol) * max(abs(a), abs(b)), Fraction(1, 10**9))
    return abs(a - b) <= tolerance


def score_numeric(prediction: str, gold: str) -> ScoreResult:
    """Score a free-text prediction against a numeric gold answer."""
    gold_value = parse_number(gold)
    if gold_value is None:
        return ScoreResult(False, None, f"gold answer {gold!r} is not a number")
    value = extract_number(prediction)
    if value is None:
        return ScoreResult(False, None, None)
    return ScoreResult(numbers_equal(value, gold_value), canonical_number(value), None)
