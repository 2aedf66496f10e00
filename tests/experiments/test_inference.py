"""experiments/inference.py: the non-inferiority test keeps its error rates, the power count delivers
its power, the binomial test finds chance, and collapse is told apart from content-dependent silence."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.inference import Turn, above_chance, items_for_power, non_inferiority, silence_profile


def _pass_rate(true_diff: float, margin: float, n: int, sims: int, seed: int) -> float:
    """Share of simulated paired runs (two benchmarks, per-item differences in {-1, 0, 1}) that pass."""
    rng = np.random.default_rng(seed)
    p_up = 0.2 + true_diff / 2  # P(+1) - P(-1) = true_diff, P(0) = 0.6 - ... kept valid below
    p_down = 0.2 - true_diff / 2
    passed = 0
    for _ in range(sims):
        diffs = {b: rng.choice([1.0, -1.0, 0.0], size=n, p=[p_up, p_down, 1 - p_up - p_down]).tolist()
                 for b in ("gsm8k", "svamp")}
        passed += non_inferiority(diffs, margin, 0.95, 0.8).passed
    return passed / sims


def test_a_system_exactly_margin_worse_passes_about_five_percent_of_the_time() -> None:
    rate = _pass_rate(true_diff=-0.05, margin=0.05, n=300, sims=1500, seed=0)
    assert 0.02 <= rate <= 0.08


def test_one_standard_error_would_have_passed_what_this_test_refuses() -> None:
    """At a true difference of zero and too few items, "within one SE" passes; the test does not."""
    diffs = {"gsm8k": [1.0, -1.0] * 20 + [-1.0] * 4}  # mean -0.09, SE ~0.15: within one SE of 0
    result = non_inferiority(diffs, margin=0.05, confidence=0.95, power=0.8)
    assert abs(result.difference.mean) < result.difference.se
    assert not result.passed
    assert result.items_for_power > 44  # and the report says how many items would have been needed


def test_the_power_count_gives_about_eighty_percent_power() -> None:
    sd = float(np.sqrt(0.4))  # SD of a {-1: 0.2, 0: 0.6, +1: 0.2} difference
    n = items_for_power([sd, sd], margin=0.1, confidence=0.95, power=0.8)
    rate = _pass_rate(true_diff=0.0, margin=0.1, n=n, sims=1500, seed=1)
    assert 0.74 <= rate <= 0.86


def test_a_margin_must_be_stated() -> None:
    with pytest.raises(ValueError, match="margin"):
        non_inferiority({"gsm8k": [0.0, 1.0]}, margin=0.0, confidence=0.95, power=0.8)


def test_chance_level_is_not_above_chance_and_a_clear_lead_is() -> None:
    assert above_chance(25, 100, 0.25, alpha=0.05)[0] is False  # MMLU's four choices, guessed
    ok, p = above_chance(40, 100, 0.25, alpha=0.05)
    assert ok and p < 0.001
    with pytest.raises(ValueError):
        above_chance(5, 4, 0.25, alpha=0.05)


def test_silence_before_any_answer_on_every_item_is_collapse() -> None:
    turns = [Turn(silent=True, answer_existed=False)] * 500
    profile = silence_profile(1, turns, collapse_share=0.9)
    assert profile.collapsed and "COLLAPSE" in profile.text()


def test_silence_that_follows_information_is_not_collapse() -> None:
    turns = ([Turn(silent=True, answer_existed=False, needed=False)] * 50
             + [Turn(silent=False, answer_existed=False, needed=True)] * 50)
    profile = silence_profile(2, turns, collapse_share=0.9)
    assert not profile.collapsed
    assert profile.silent_when_not_needed == 1.0 and profile.silent_when_needed == 0.0
    assert profile.silent_after_an_answer is None
