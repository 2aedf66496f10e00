"""Learning proof on CPU: the GSPO trainer, reward and dual budget do what the paper claims, in
miniature, with the tiny random policy and fixed seeds (see tests/learning_env.py for the tasks).

Numbers seen on 2 CPU cores are printed (``pytest -s``). These are fixed-seed demonstrations,
deterministic on CPU, not statistics: the silence run in particular depends on the seed (other
seeds and samplers were seen to silence the helper too, or to learn silence more slowly), because
one shared tiny policy separates the two roles only through a few prompt tokens.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from learning_env import agent_silence, make_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.usefixtures("one_thread")]

TALK = ["mas.agents=3", "budget.target=16", "reward.token_norm=16", "budget.lr=0.05", "budget.lambda_max=3",
        "gspo.lr=0.005"]
TALK_STEPS = 60


def _train(run, steps: int) -> list:
    return [run.trainer.train_step() for _ in range(steps)]


def test_silence_rises_for_the_agent_that_never_helps():
    """λ_tok > 0 on a task where agent 1's messages never help: its silence rate rises several-fold.

    What this does NOT show (yet): the issue's full claim, silence > 50 % *while team accuracy holds*.
    With one shared tiny random policy the two roles are barely separable, so the push towards
    silence reaches the helper too (seen on seeds 0-3: useless agent 1-3 % -> 18-29 %, helper
    silence up to ~25 %, team accuracy 0.98 -> 0.75-0.83). The assertions below are what holds.
    """
    run = make_run(["reward.lambda_tok=1.0", "budget.enabled=false"], task="helper", helper_agent=0)
    results = _train(run, 30)
    silence = [agent_silence(r.episodes, 1) for r in results]
    helper_silence = [agent_silence(r.episodes, 0) for r in results]
    acc = [r.metrics["train/accuracy"] for r in results]
    start, end = statistics.mean(silence[:3]), statistics.mean(silence[-5:])
    print(f"\nsilence of the useless agent: {start:.2f} -> {end:.2f}; helper silence "
          f"{statistics.mean(helper_silence[-5:]):.2f}; team accuracy {statistics.mean(acc[:3]):.2f} -> "
          f"{statistics.mean(acc[-5:]):.2f}; clip fraction (last) "
          f"{results[-1].metrics['gspo/clip_frac_low'] + results[-1].metrics['gspo/clip_frac_high']:.2f}")
    assert start < 0.10
    assert end >= max(0.15, 3 * start)
    assert results[-1].metrics["train/tokens_completion"] < results[0].metrics["train/tokens_completion"]


@pytest.fixture(scope="module")
def budget_runs() -> dict[str, list[float]]:
    torch.set_num_threads(1)
    budget = make_run(TALK + ["reward.lambda_tok=0.3"], task="talk")
    no_penalty = make_run(TALK + ["reward.lambda_tok=0", "budget.enabled=false"], task="talk")
    out = {}
    for name, run in (("budget", budget), ("lambda0", no_penalty)):
        res = _train(run, TALK_STEPS)
        out[name] = [r.metrics["train/budget_tokens"] for r in res]
        out[name + "_lambda"] = [r.metrics["train/lambda_tok"] for r in res]
    return out


def test_dual_budget_brings_tokens_to_the_target(budget_runs):
    tokens, target = budget_runs["budget"], 16.0
    end = statistics.mean(tokens[-10:])
    print(f"\ntokens/episode: untrained {tokens[0]:.1f}, last-10 mean {end:.1f} (B = {target}); "
          f"λ_tok {budget_runs['budget_lambda'][0]:.2f} -> {budget_runs['budget_lambda'][-1]:.2f}")
    assert tokens[0] > 1.5 * target  # the budget is well below untrained usage
    assert abs(end - target) <= 0.15 * target


def test_removing_the_penalty_at_least_doubles_token_use(budget_runs):
    with_penalty = statistics.mean(budget_runs["budget"][-10:])
    without = statistics.mean(budget_runs["lambda0"][-10:])
    print(f"\nlast-10 tokens/episode: λ=0 {without:.1f} vs dual budget {with_penalty:.1f} "
          f"({without / with_penalty:.2f}x)")
    assert without >= 2.0 * with_penalty
