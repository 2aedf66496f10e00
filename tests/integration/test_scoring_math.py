"""Math answers: extraction, math-verify equivalence in worker processes, grader failures."""

import os
import signal
import threading

import pytest
from helpers import grade_text

from components.scoring.math_grader import MathGraderPool, extract_math_answer, score_math


@pytest.fixture(scope="module")
def pool():
    p = MathGraderPool(max_workers=1)
    yield p
    p.close()


EQUIVALENT = [
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}"),
    ("The final answer is $\\frac{2}{4}$.", "\\frac{1}{2}"),
    ("\\boxed{(1, 2]}", "(1,2]"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{36}", "\\$36"),
    ("\\boxed{10^\\circ}", "10"),
    ("\\boxed{\\{1,2,3\\}}", "\\{3,2,1\\}"),
    ("We get $x = 5$ so the answer is $5$.", "5"),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}"),
]


@pytest.mark.parametrize(("prediction", "gold"), EQUIVALENT)
def test_equivalent_forms(pool: MathGraderPool, prediction: str, gold: str) -> None:
    result = score_math(prediction, gold, pool=pool)
    assert result.correct, result
    assert result.error is None


NOT_EQUIVALENT = [
    ("\\boxed{[1,2)}", "(1,2]"),
    ("\\boxed{(2, 3)}", "(3,2)"),
    ("\\boxed{\\frac{1}{3}}", "0.33"),
    ("\\boxed{x^2-1}", "(x+1)^2"),
]


@pytest.mark.parametrize(("prediction", "gold"), NOT_EQUIVALENT)
def test_different_answers(pool: MathGraderPool, prediction: str, gold: str) -> None:
    result = score_math(prediction, gold, pool=pool)
    assert not result.correct and result.error is None, result


def test_extraction_priority() -> None:
    assert extract_math_answer("so $x=3$ and \\boxed{\\frac{1}{2}} then $y$") == "\\frac{1}{2}"
    assert extract_math_answer("\\boxed{1} first, finally \\boxed{\\sqrt{2}}") == "\\sqrt{2}"
    assert extract_math_answer("Thus the answer is 7. Done") == "7"
    assert extract_math_answer("We find $a=2$ and then $b = 4$") == "b = 4"
    assert extract_math_answer("nothing here") is None


def test_unparseable_gold_is_a_grader_error(pool: MathGraderPool) -> None:
    result = score_math("\\boxed{5}", "\\frac{", pool=pool)
    assert not result.correct
    assert result.error and result.error.startswith("grader:")


def test_hung_worker_times_out_and_is_replaced(pool: MathGraderPool) -> None:
    score_math("\\boxed{1}", "1", pool=pool)  # make sure a worker exists
    worker = pool._idle.queue[0]
    os.kill(worker.proc.pid, signal.SIGSTOP)  # a stuck grader
    result = score_math("\\boxed{1}", "1", pool=pool, timeout_s=1.0)
    assert result == type(result)(False, "1", result.error)
    assert "grader:" in (result.error or "") and "exceeded" in result.error
    assert worker.proc.poll() is not None  # killed
    assert score_math("\\boxed{1}", "1", pool=pool).correct  # a fresh worker took over


def test_crashed_worker_is_reported(pool: MathGraderPool) -> None:
    score_math("\\boxed{1}", "1", pool=pool)
    worker = pool._idle.queue[0]
    os.kill(worker.proc.pid, signal.SIGKILL)
    result = score_math("\\boxed{2}", "2", pool=pool)
    assert not result.correct and "grader:" in (result.error or "")
    assert score_math("\\boxed{2}", "2", pool=pool).correct


def test_works_from_threads(pool: MathGraderPool) -> None:
    """The failure mode this design exists for: math-verify called from non-main threads."""
    out: list[bool] = []

    def job() -> None:
        out.append(score_math("\\boxed{\\frac{1}{2}}", "0.5", pool=pool).correct)

    threads = [threading.Thread(target=job) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [True] * 4


def test_score_answer_dispatch_math() -> None:
    assert grade_text("math", "\\boxed{\\dfrac{3}{6}}", "\\frac12").correct


def test_grading_timeout_is_a_grader_error_not_a_wrong_answer(pool: MathGraderPool) -> None:
    """A correct answer too costly to compare: math-verify's own timeout fires and it answers False.
    That must come back as a grader error (counted in ``grading_errors``), never a silent wrong."""
    result = score_math("\\boxed{\\frac{14}{3} + 0\\cdot 9^{9^{9^{9}}}}", "\\frac{14}{3}", pool=pool, timeout_s=2.0)
    assert not result.correct
    assert result.error and result.error.startswith("grader:") and "timed out" in result.error, result
    assert score_math("\\boxed{\\frac{14}{3}}", "\\frac{14}{3}", pool=pool).correct  # the worker survived


def _fake_verify(monkeypatch: pytest.MonkeyPatch, outcomes: list) -> list:
    """Replace ``math_verify.verify`` (in this process) by one answering ``outcomes`` in turn."""
    import math_verify

    calls: list = []

    def verify(gold, target, **kwargs):
        calls.append(kwargs)
        outcome = outcomes[len(calls) - 1] if len(calls) <= len(outcomes) else False
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(math_verify, "verify", verify)
    return calls


def test_timeout_on_one_pair_does_not_hide_a_proof_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsed answers are [sympy, string]; a timeout on the first pair must not stop the others."""
    from math_verify.errors import TimeoutException

    from components.scoring.math_grader import _verify

    calls = _fake_verify(monkeypatch, [TimeoutException("Operation timed out!"), True])
    assert _verify("0.5", "\\frac{1}{2}", 3) == (True, None)
    assert calls[0]["raise_on_error"] is True and calls[0]["timeout_seconds"] == 3


def test_comparison_errors_stay_a_plain_wrong_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only math-verify's timeout is a grader error; its other failures mean "not equal", as before."""
    from math_verify.errors import TimeoutException

    from components.scoring.math_grader import _verify

    _fake_verify(monkeypatch, [TypeError("cannot compare")] * 4)
    assert _verify("0.5", "\\frac{1}{2}", 3) == (False, None)
    _fake_verify(monkeypatch, [TypeError("cannot compare"), TimeoutException("Operation timed out!")])
    correct, error = _verify("0.5", "\\frac{1}{2}", 3)
    assert not correct and error is not None and "timed out (3s) comparing" in error


def test_parse_timeout_is_a_grader_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse that times out is no verdict either (math-verify would return [] = "unparseable")."""
    import math_verify
    from math_verify.errors import TimeoutException

    from components.scoring.math_grader import _verify

    real_parse = math_verify.parse

    def parse(text, **kwargs):
        assert kwargs["raise_on_error"] is True
        if "slow" in text:
            raise TimeoutException("Operation timed out!")
        if "broken" in text:
            raise ValueError("no parse")
        return real_parse(text, **kwargs)

    monkeypatch.setattr(math_verify, "parse", parse)
    correct, error = _verify("\\text{slow}", "\\frac{1}{2}", 2)
    assert not correct and error and "timed out (2s) parsing the answer" in error
    correct, error = _verify("1", "\\text{slow}", 2)
    assert not correct and error and "timed out (2s) parsing the gold answer" in error
    assert _verify("\\text{broken}", "\\frac{1}{2}", 2) == (False, None)  # unparseable: simply wrong


def test_math_spans_match_the_regex_they_replace_in_linear_time() -> None:
    """The span regex was quadratic on unclosed openers: 100 000 `\\(` took 2 minutes, in C, where
    neither eval.code_timeout_s nor SIGTERM acts. The scanner finds exactly what the regex found."""
    import random
    import re
    import time

    from components.scoring.math_grader import math_spans

    regex = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
    pieces = ["$", "$$", "\\(", "\\)", "\\[", "\\]", "a", "1", "\n", "\\", "(", ")", " "]
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert list(math_spans(text)) == [next(g for g in m.groups() if g is not None)
                                          for m in regex.finditer(text)], text
    start = time.monotonic()
    assert extract_math_answer("\\(" * 100000) is None
    assert extract_math_answer("The answer is " + "\\(" * 50000 + " $x$") == "x"
    assert time.monotonic() - start < 10
