r"""Multiple-choice answers (MMLU A-D, AQuA A-E): extract one letter from free text.

Rules, in priority order (first rule that yields a valid letter wins):

1. an explicit answer phrase: "answer is (C)", "The answer is C", "Answer: C", "\boxed{C}",
   "correct option is C" (last occurrence);
2. "Option C" / "choice (C)" (last occurrence);
3. a parenthesised letter "(C)" (last occurrence);
4. a line that is only a letter, possibly decorated: "C", "**C**", "C)", "C.", "(C)" (last line);
5. the first line starting with a letter followed by ")", "." or ":" ("C) 18", "B. because");
6. option text: the prediction mentions exactly one option's text (whole words).

An uppercase letter is required except inside parentheses or after "answer is"/"option", and
a bare letter must be followed by punctuation or the end of the line, so the article in
"A train leaves ..." is never read as option A.
"""

from __future__ import annotations

import re
import string

from components.scoring.result import ScoreResult, ScoringError

_END = r"(?=$|[\s.,;:!?)\]*}]|\\)"
_PHRASE_RE = re.compile(
    r"(?:answer|option|choice)\s*(?:is|:|=|would\s+be|should\s+be)?\s*:?\s*(?:\*\*)?\s*"
    r"(?:option\s+|choice\s+)?(?:\\boxed\{|\\text\{|\*\*)?[(\[]?([A-Ea-e])[)\]]?" + _END,
    re.I,
)
_BOXED_RE = re.compile(r"\\boxed\{\s*(?:\\text\{)?\s*\(?([A-E])\)?\s*\}?\s*\}")
_OPTION_RE = re.compile(r"\b(?:option|choice)\s*[(\[]?([A-Ea-e])[)\]]?" + _END, re.I)
_PAREN_RE = re.compile(r"\(([A-E])\)")
_LINE_RE = re.compile(r"^\s*(?:\*\*|__)?[(\[]?([A-E])(?:[)\].:]|\*\*|__)*\s*$")
_FIRST_LINE_RE = re.compile(r"^\s*(?:\*\*)?\(?([A-E])(?:[).:]|\s+-\s|\*\*)")
_AQUA_PREFIX_RE = re.compile(r"^\s*\(?[A-Ea-e][).:]\s*")


def _letters(n_choices: int | None) -> str:
    return string.ascii_uppercase[: n_choices if n_choices else 5]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().strip(".").lower()


def option_texts(choices: list[str]) -> list[str]:
    """Option texts without an AQuA-style letter prefix ("A)125" -> "125")."""
    return [_AQUA_PREFIX_RE.sub("", str(c)) for c in choices]


def _by_text(prediction: str, choices: list[str], letters: str) -> str | None:
    texts = [_norm(t) for t in option_texts(choices)]
    pred = _norm(prediction)
    exact = [i for i, t in enumerate(texts) if t and t == pred]
    if len(exact) == 1:
        return letters[exact[0]]
    hits = [i for i, t in enumerate(texts)
            if t and re.search(r"(?<!\w)" + re.escape(t) + r"(?!\w)", pred)]
    # An option contained in another hit ("5" inside "5 km") is not a separate mention.
    hits = [i for i in hits if not any(j != i and texts[i] in texts[j] for j in hits)]
    return letters[hits[0]] if len(hits) == 1 else None


def extract_choice(prediction: str, choices: list[str] | None = None) -> str | None:
    """The chosen letter (uppercase) or None; ``choices`` limits the letters and enables rule 6."""
    text = prediction or ""
    letters = _letters(len(choices) if choices else None)

    def ok(letter: str | None) -> str | None:
        return letter.upper() if letter and letter.upper() in letters else None

    for pattern in (_BOXED_RE, _PHRASE_RE, _OPTION_RE, _PAREN_RE):
        for m in reversed(list(pattern.finditer(text))):
            letter = m.group(1)
            bracketed = m.string[m.start(1) - 1 : m.start(1)] in ("(", "[")
            if letter.islower() and not bracketed:
                continue  # "the answer is a bit ..." is prose, "(a)" is a choice
            if ok(letter):
                return ok(letter)
    for line in reversed(text.splitlines()):
        m = _LINE_RE.match(line)
        if m and ok(m.group(1)):
            return ok(m.group(1))
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    m = _FIRST_LINE_RE.match(first)
    if m and ok(m.group(1)):
        return ok(m.group(1))
    if choices:
        return _by_text(text, choices, letters)
    return None


def score_choice(prediction: str, gold: str, meta: dict | None = None) -> ScoreResult:
    """Score a prediction against a gold letter; ``meta["choices"]`` (optional) lists the options."""
    choices = (meta or {}).get("choices")
    if choices is not None and not isinstance(choices, list | tuple):
        raise ScoringError(f"choice scoring: meta['choices'] must be a list, got {type(choices).__name__}")
    gold_letter = str(gold).strip().strip("()").upper()
    letters = _letters(len(choices) if choices else None)
    if len(gold_letter) != 1 or gold_letter not in letters:
        return ScoreResult(False, None, f"gold answer {gold!r} is not one of the letters {letters}")
    letter = extract_choice(prediction, list(choices) if choices else None)
    return ScoreResult(letter == gold_letter, letter, None)
