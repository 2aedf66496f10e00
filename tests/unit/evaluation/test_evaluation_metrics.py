"""Aggregates, standard error, Pareto front, per-system summary and silence grid."""

import math

import pytest

from components.evaluation.metrics import (
    EpisodeStats,
    aggregate,
    silence_grid,
    standard_error,
    summarise,
)
from components.mas.records import Episode, Message
from components.plotting import pareto_front
from components.scoring.result import ScoreResult


def _msg(agent, rnd, prompt, completion, silent=False, recipients=(1, 2), truncated=False):
    return Message("q", 0, agent, "solver", rnd, [1] * prompt, [2] * completion, [-0.1] * completion, silent,
                   [] if silent else list(recipients), truncated=truncated)


def _ep(qid, correct, msgs, error=None):
    return Episode(qid, 0, "gsm8k", msgs, final_answer="x", grade=ScoreResult(correct, None, error))


def test_standard_error_values():
    assert standard_error(0.5, 4) == pytest.approx(0.25)
    assert standard_error(0.0, 10) == 0.0 and standard_error(1.0, 10) == 0.0
    assert standard_error(0.9, 100) == pytest.approx(0.03)
    assert standard_error(0.3, 0) == 0.0
    with pytest.raises(ValueError):
        standard_error(1.5, 3)


def test_aggregate_counts_tokens_turns_silence_and_errors():
    eps = [_ep("a", True, [_msg(0, 0, 10, 4, truncated=True), _msg(1, 0, 12, 2, silent=True)]),
           _ep("b", False, [_msg(0, 0, 20, 6, recipients=(1,), truncated=True), _msg(1, 0, 8, 3)],
               error="timeout: 10s")]
    r = aggregate("gsm8k", "agent_gspo", eps)
    assert (r.n, r.correct, r.accuracy) == (2, 1, 0.5)
    assert r.accuracy_se == pytest.approx(math.sqrt(0.25 / 2))
    assert r.tokens_prompt == 50 and r.tokens_completion == 15
    assert r.tokens_communicated == 4 * 2 + 0 + 6 * 1 + 3 * 2
    assert r.tokens_total == 65 and r.tokens_total_mean == 32.5
    assert r.tokens_per_correct == 65.0
    assert r.turns == 1.5 and r.messages == 2.0 and r.silence_rate == 0.25
    assert r.grading_errors == 1
    assert r.cap_hit_rate is None  # no cap given: not measured
    # the two replies the cap cut (the engine marks them truncated); a silent reply, or one whose EOS
    # fell on the cap, is never a cap hit whatever its length (was: length >= cap, silent ones included)
    capped = aggregate("gsm8k", "agent_gspo", eps, cap=2)
    assert capped.cap_hit_rate == 0.5
    stats = [EpisodeStats.from_episode(e) for e in eps]
    assert aggregate("gsm8k", "agent_gspo", stats, cap=2) == capped


def test_aggregate_none_correct_and_empty():
    r = aggregate("mmlu", "single_cot", [_ep("a", False, [_msg(0, 0, 5, 1)])])
    assert r.tokens_per_correct is None and r.accuracy == 0.0
    e = aggregate("mmlu", "single_cot", [])
    assert e.n == 0 and e.accuracy == 0.0 and e.silence_rate == 0.0


def test_pareto_front():
    pts = [(100, 0.5), (50, 0.5), (200, 0.9), (150, 0.4), (50, 0.2), (300, 0.9)]
    assert pareto_front(pts) == [1, 2]
    assert pareto_front([(1, 1), (1, 1)]) == [0, 1]
    assert pareto_front([]) == []
    assert pareto_front([(10, 0.1), (20, 0.2), (30, 0.3)]) == [0, 1, 2]


def test_summarise_macro_accuracy_and_token_sums():
    a = aggregate("gsm8k", "s", [_ep("a", True, [_msg(0, 0, 10, 0)])])
    b = aggregate("mmlu", "s", [_ep(q, False, [_msg(0, 0, 10, 0)]) for q in "abc"])
    s = summarise([a, b])["s"]
    assert s["accuracy"] == pytest.approx(0.5) and s["accuracy_micro"] == pytest.approx(0.25)
    assert s["tokens_total"] == 40 and s["tokens_per_correct"] == 40.0 and s["n"] == 4


def test_silence_grid_shape_and_rates():
    eps = [_ep("a", True, [_msg(0, 0, 1, 1), _msg(1, 0, 1, 1, silent=True), _msg(0, 1, 1, 1, silent=True),
                           _msg(3, 2, 1, 1)])]  # agent 3 = decider: ignored
    g = silence_grid("agent_gspo", eps, agents=2, rounds=2)
    assert g.total == [[1, 1], [1, 0]] and g.silent == [[0, 1], [1, 0]]
    assert g.rates() == [[0.0, 1.0], [1.0, None]]


def test_episode_stats_aggregate_like_episodes():
    eps = [_ep("a", True, [_msg(0, 0, 10, 4), _msg(1, 1, 12, 2, silent=True)], error="x"),
           _ep("b", False, [_msg(0, 0, 20, 6, recipients=(1,))])]
    stats = [EpisodeStats.from_episode(e) for e in eps]
    assert aggregate("g", "s", stats) == aggregate("g", "s", eps)
    assert silence_grid("s", stats, 2, 2) == silence_grid("s", eps, 2, 2)
