"""Reward arithmetic, repetition and per-message attribution on hand-built episodes."""

from __future__ import annotations

import math

import pytest

from components.config import RewardConfig
from components.mas.records import Episode, Message
from components.reward import (
    PART_KEYS,
    RepetitionError,
    RewardError,
    apply_rewards,
    compute_reward,
    episode_repetition,
    message_costs,
    message_repetitions,
    message_rewards,
    ngram_repetition,
)
from components.scoring.result import ScoreResult


def msg(agent: int, rnd: int, completion: list[int], silent: bool = False, prompt_len: int = 10,
        recipients: list[int] | None = None) -> Message:
    rec = [] if silent else (recipients if recipients is not None else [a for a in range(3) if a != agent])
    return Message(question_id="q1", group_index=0, agent_id=agent, role="solver", round=rnd,
                   prompt_ids=list(range(prompt_len)), completion_ids=completion,
                   logprobs=[-1.0] * len(completion), silent=silent, recipients=rec)


def episode(messages: list[Message], correct: bool = True) -> Episode:
    return Episode(question_id="q1", group_index=0, benchmark="gsm8k", messages=messages,
                   final_answer="5", grade=ScoreResult(correct, "5", None))


# ---- repetition -------------------------------------------------------------------------------

def test_ngram_repetition_crafted():
    assert ngram_repetition([[1, 2, 3], [2, 3, 4]], n=2) == [0.0, 0.5]
    # identical message repeated: fully redundant
    assert ngram_repetition([[5, 6, 7, 8], [5, 6, 7, 8]], n=3) == [0.0, 1.0]
    # within-message repeats do not count, shorter than n -> 0
    assert ngram_repetition([[1, 1, 1, 1], [9, 9]], n=2) == [0.0, 0.0]
    # history accumulates over all earlier messages: (1,2,3) from msg0, (7,8,9) from msg1
    assert ngram_repetition([[1, 2, 3], [7, 8, 9], [1, 2, 3, 7, 8, 9]], n=3) == [0.0, 0.0, pytest.approx(2 / 4)]
    assert ngram_repetition([], n=3) == []


def test_ngram_repetition_rejects_bad_n():
    with pytest.raises(RepetitionError, match="repetition_ngram"):
        ngram_repetition([[1, 2]], n=0)


def test_silent_messages_neither_repeat_nor_are_repeated():
    silent = [False, True, False]
    completions = [[1, 2, 3, 4], [1, 2, 3, 4], [3, 4, 5, 6]]
    # msg1 is silent -> 0; msg2 (n=2): (3,4) was said in msg0, (4,5),(5,6) were not -> 1/3
    assert message_repetitions(silent, completions, n=2) == [0.0, 0.0, pytest.approx(1 / 3)]
    assert episode_repetition(silent, completions, n=2) == pytest.approx((0.0 + 1 / 3) / 2)
    # the silent message carries (5,6), which must not count as said
    assert message_repetitions([False, True, False], [[1, 2], [5, 6], [5, 6]], n=2) == [0.0, 0.0, 0.0]
    assert episode_repetition([True, True], [[1, 2, 3], [1, 2, 3]]) == 0.0


# ---- episode reward ---------------------------------------------------------------------------

def make_cfg(**kw) -> RewardConfig:
    base = dict(lambda_tok=0.5, lambda_turn=0.01, lambda_rep=0.2, token_measure="completion", token_norm=100.0,
                repetition_ngram=2)
    base.update(kw)
    return RewardConfig(**base)


def sample_episode(correct: bool = True) -> Episode:
    return episode([
        msg(0, 0, [1, 2, 3, 4]),          # 4 tokens, rep 0
        msg(1, 0, [1, 2, 9, 9, 9]),       # 5 tokens, grams (1,2)seen,(2,9),(9,9),(9,9) -> 1/4
        msg(2, 0, [7, 7], silent=True),   # 2 tokens, silent
        msg(0, 1, [2, 9, 3, 4]),          # grams (2,9)seen,(9,3),(3,4)seen -> 2/3
    ], correct=correct)


def test_compute_reward_arithmetic():
    ep = sample_episode()
    cfg = make_cfg()
    b = compute_reward(ep, cfg, lambda_tok=0.5)
    rep = (0.0 + 0.25 + 2 / 3) / 3
    assert b.tokens == 4 + 5 + 2 + 4 == ep.completion_tokens
    assert b.turns == 3
    assert b.repetition == pytest.approx(rep)
    assert b.tokens_penalty == pytest.approx(0.5 * 15 / 100)
    assert b.turn_penalty == pytest.approx(0.03)
    assert b.repetition_penalty == pytest.approx(0.2 * rep)
    assert b.total == pytest.approx(1.0 - 0.075 - 0.03 - 0.2 * rep)
    assert set(b.parts()) == set(PART_KEYS)
    assert b.parts()["tokens"] == 15.0 and b.parts()["task"] == 1.0

    wrong = compute_reward(sample_episode(correct=False), cfg, lambda_tok=0.5)
    assert wrong.task == 0.0
    assert wrong.total == pytest.approx(b.total - 1.0)


@pytest.mark.parametrize("measure", ["completion", "communicated", "total"])
def test_token_measure_follows_config(measure: str):
    ep = sample_episode()
    b = compute_reward(ep, make_cfg(token_measure=measure), lambda_tok=1.0)
    assert b.tokens == ep.tokens(measure)
    assert b.tokens_penalty == pytest.approx(ep.tokens(measure) / 100)
    expected = {"completion": 15, "communicated": (4 + 5 + 4) * 2, "total": 15 + 40}[measure]
    assert b.tokens == expected


def test_lambda_zero_removes_token_penalty_and_lambda_validated():
    ep = sample_episode()
    assert compute_reward(ep, make_cfg(), lambda_tok=0.0).tokens_penalty == 0.0
    for bad in (math.nan, math.inf, -math.inf, "x"):
        with pytest.raises(RewardError, match="lambda_tok"):
            compute_reward(ep, make_cfg(), lambda_tok=bad)  # type: ignore[arg-type]


def test_negative_lambda_pays_per_token():
    """Budget mode 'target' drives λ below 0 when a batch is under B: the same term becomes a bonus."""
    ep = sample_episode()
    b = compute_reward(ep, make_cfg(), lambda_tok=-0.5)
    assert b.tokens_penalty == pytest.approx(-0.5 * b.tokens / make_cfg().token_norm)
    assert b.tokens_penalty < 0
    assert b.total == pytest.approx(b.task - b.tokens_penalty - b.turn_penalty - b.repetition_penalty)
    assert b.total > compute_reward(ep, make_cfg(), lambda_tok=0.0).total


def test_apply_rewards_fills_in_place():
    eps = [sample_episode(True), sample_episode(False), episode([msg(0, 0, [1], silent=True)], correct=True)]
    cfg = make_cfg()
    apply_rewards(eps, cfg, lambda_tok=0.3)
    for ep in eps:
        b = compute_reward(ep, cfg, 0.3)
        assert ep.reward == b
    # all-silent episode: no turns, no repetition, only its silence tokens cost
    assert eps[2].reward.repetition == 0.0 and eps[2].reward.turn_penalty == 0.0
    assert eps[2].reward.total == pytest.approx(1.0 - 0.3 * 1 / 100)
    assert eps[0].reward.total > eps[1].reward.total


# ---- per-message attribution ------------------------------------------------------------------

@pytest.mark.parametrize("measure", ["completion", "communicated", "total"])
@pytest.mark.parametrize("correct", [True, False])
def test_message_costs_sum_to_episode_cost(measure: str, correct: bool):
    ep = sample_episode(correct)
    cfg = make_cfg(token_measure=measure)
    b = compute_reward(ep, cfg, lambda_tok=0.7)
    costs = message_costs(ep, cfg, lambda_tok=0.7)
    assert len(costs) == len(ep.messages)
    for part in ("tokens_penalty", "turn_penalty", "repetition_penalty"):
        assert sum(c[part] for c in costs) == pytest.approx(getattr(b, part))
    rewards = message_rewards(ep, cfg, lambda_tok=0.7)
    # sum of (r_task - reward_i) over messages == the episode's total cost
    assert sum(b.task - r for r in rewards) == pytest.approx(b.task - b.total)


def test_message_rewards_charge_verbose_agent_more():
    ep = episode([msg(0, 0, list(range(50))), msg(1, 0, [100], silent=True), msg(2, 0, [200, 201, 202])])
    r = message_rewards(ep, make_cfg(), lambda_tok=1.0)
    assert r[1] > r[2] > r[0]
    # a silent message pays only for its own (marker) tokens
    assert r[1] == pytest.approx(1.0 - 1 / 100)


def test_reward_refuses_an_ungraded_episode():
    ep = Episode(question_id="q1", group_index=0, benchmark="gsm8k", messages=[msg(0, 0, [1, 2])])
    with pytest.raises(RewardError, match="was not graded"):
        compute_reward(ep, RewardConfig(), lambda_tok=0.1)
