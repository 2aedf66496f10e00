"""The paired rule that every crowning decision reads: ties, noise and too few items never win."""

from __future__ import annotations

import math
import random

import pytest

from components.comparison import ComparisonRule, IncomparableItems, ItemScore, macro_interval, paired_verdict

RULE = ComparisonRule(confidence=0.95, margin=0.02, token_factor=0.9, max_token_ratio=1.1, min_items=20)


def _system(correct: dict[str, list[bool]], tokens: dict[str, list[float]]) -> dict[str, list[ItemScore]]:
    return {b: [ItemScore(f"{b}-{i}", c, t) for i, (c, t) in enumerate(zip(correct[b], tokens[b], strict=True))]
            for b in correct}


def test_identical_results_are_a_tie_never_a_win() -> None:
    sys_ = _system({"gsm8k": [True, False] * 30}, {"gsm8k": [100.0] * 60})
    verdict = paired_verdict(sys_, sys_, RULE)
    assert verdict.outcome == "tie" and not verdict.wins
    assert verdict.accuracy.mean == 0 and verdict.accuracy.se == 0 and verdict.accuracy.low == 0


def test_all_zero_accuracy_at_equal_tokens_is_a_tie() -> None:
    a = _system({"mmlu": [False] * 40}, {"mmlu": [50.0] * 40})
    assert paired_verdict(a, a, RULE).outcome == "tie"


def test_too_few_items_decide_nothing_even_when_every_item_improves() -> None:
    a = _system({"gsm8k": [True] * 5}, {"gsm8k": [10.0] * 5})
    b = _system({"gsm8k": [False] * 5}, {"gsm8k": [10.0] * 5})
    verdict = paired_verdict(a, b, RULE)
    assert verdict.outcome == "too_few" and "5 < min_items 20" in verdict.reason


def test_one_lucky_item_on_a_one_item_benchmark_never_decides() -> None:
    """Seven benchmarks of one item each (the smoke profile's gate, min_items 2): the candidate right on
    one of them once had SE 0 and counted as "better beyond noise"; one item has no variance estimate."""
    names = [f"b{k}" for k in range(7)]
    a = _system({b: [b == "b0"] for b in names}, {b: [10.0] for b in names})
    b = _system({b: [False] for b in names}, {b: [10.0] for b in names})
    verdict = paired_verdict(a, b, ComparisonRule(confidence=0.95, margin=0.02, token_factor=0.9,
                                                  max_token_ratio=1.1, min_items=2))
    assert verdict.outcome == "tie" and not verdict.wins
    assert verdict.accuracy.se == math.inf and verdict.accuracy.low == -math.inf
    cheap = _system({b: [False] for b in names}, {b: [1.0] for b in names})  # 10x fewer tokens, still one item each
    assert paired_verdict(cheap, b, ComparisonRule(confidence=0.95, margin=0.02, token_factor=0.9,
                                                   max_token_ratio=1.1, min_items=2)).outcome == "tie"
    two = macro_interval({"x": [1.0, 0.0], "y": [1.0]}, 0.95)  # one benchmark of one item is enough
    assert math.isinf(two.se) and two.mean == pytest.approx(0.75)


def test_a_real_improvement_beyond_noise_is_better() -> None:
    rng = random.Random(0)
    base = [rng.random() < 0.3 for _ in range(200)]
    improved = [c or rng.random() < 0.4 for c in base]
    verdict = paired_verdict(_system({"gsm8k": improved}, {"gsm8k": [100.0] * 200}),
                             _system({"gsm8k": base}, {"gsm8k": [100.0] * 200}), RULE)
    assert verdict.outcome == "better", verdict.reason
    assert verdict.accuracy.low > 0


def test_a_one_item_flip_in_two_hundred_is_noise() -> None:
    base = [i % 3 == 0 for i in range(200)]
    flipped = list(base)
    flipped[1] = True
    verdict = paired_verdict(_system({"gsm8k": flipped}, {"gsm8k": [100.0] * 200}),
                             _system({"gsm8k": base}, {"gsm8k": [100.0] * 200}), RULE)
    assert verdict.outcome == "tie"


def test_cheaper_needs_fewer_tokens_beyond_the_factor_and_accuracy_within_the_margin() -> None:
    correct = [i % 2 == 0 for i in range(100)]
    cheap = paired_verdict(_system({"svamp": correct}, {"svamp": [50.0 + i % 7 for i in range(100)]}),
                           _system({"svamp": correct}, {"svamp": [100.0 + i % 5 for i in range(100)]}), RULE)
    assert cheap.outcome == "cheaper", cheap.reason
    slightly = paired_verdict(_system({"svamp": correct}, {"svamp": [95.0 + i % 7 for i in range(100)]}),
                              _system({"svamp": correct}, {"svamp": [100.0 + i % 5 for i in range(100)]}), RULE)
    assert slightly.outcome == "tie", slightly.reason  # 0.95x is not below 0.9x


def test_more_accurate_but_far_more_tokens_is_costlier_not_better() -> None:
    base = [i % 4 == 0 for i in range(200)]
    better = [c or i % 4 == 1 for i, c in enumerate(base)]
    verdict = paired_verdict(_system({"gsm8k": better}, {"gsm8k": [300.0] * 200}),
                             _system({"gsm8k": base}, {"gsm8k": [100.0] * 200}), RULE)
    assert verdict.outcome == "costlier" and not verdict.wins


def test_worse_beyond_noise_is_worse() -> None:
    base = [True] * 100
    worse = [i % 2 == 0 for i in range(100)]
    verdict = paired_verdict(_system({"gsm8k": worse}, {"gsm8k": [10.0] * 100}),
                             _system({"gsm8k": base}, {"gsm8k": [10.0] * 100}), RULE)
    assert verdict.outcome == "worse"


def test_different_items_or_benchmarks_are_incomparable() -> None:
    a = _system({"gsm8k": [True] * 30}, {"gsm8k": [1.0] * 30})
    b = {"gsm8k": [ItemScore(f"other-{i}", True, 1.0) for i in range(30)]}
    with pytest.raises(IncomparableItems, match="different items"):
        paired_verdict(a, b, RULE)
    with pytest.raises(IncomparableItems, match="different benchmarks"):
        paired_verdict(a, _system({"mmlu": [True] * 30}, {"mmlu": [1.0] * 30}), RULE)


def test_macro_interval_weighs_benchmarks_equally() -> None:
    interval = macro_interval({"a": [1.0] * 10, "b": [0.0] * 90}, 0.95)
    assert interval.mean == pytest.approx(0.5) and interval.n == 100 and interval.se == 0


def test_the_false_win_rate_at_no_true_difference_is_at_most_the_stated_level() -> None:
    """Two systems with the same 50 % accuracy, independent errors: 'better' <= ~5 % of the time."""
    rng = random.Random(1)
    wins = 0
    trials = 400
    for _ in range(trials):
        a = [rng.random() < 0.5 for _ in range(100)]
        b = [rng.random() < 0.5 for _ in range(100)]
        wins += paired_verdict(_system({"x": a}, {"x": [1.0] * 100}), _system({"x": b}, {"x": [1.0] * 100}),
                               RULE).outcome == "better"
    assert wins / trials <= 0.08, wins


def test_rule_refuses_values_it_cannot_honour() -> None:
    for bad in ({"confidence": 1.0}, {"margin": -0.1}, {"token_factor": 0.0}, {"max_token_ratio": math.inf},
                {"min_items": 1}):
        with pytest.raises(ValueError, match="comparison rule"):
            ComparisonRule(**bad)
