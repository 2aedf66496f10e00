"""A synthetic trial function: a cheap, deterministic stand-in for "short training + dev eval".

Used by tests and by ``python -m components.search.worker --synthetic`` to exercise the search
machinery (sampler, constraint, budgets, storage, workers) without a model. Its shape mimics
the real trade-off Agent-GSPO is about: more agents and rounds raise accuracy *and* tokens,
a larger ``lambda_tok`` makes agents terser (fewer tokens, slightly lower accuracy), so the
token limit ``search.max_tokens_per_episode`` binds and the best feasible point is interior.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import optuna

from components.comparison import ItemScore
from components.config import Config
from components.config_sections import EPS_LOW
from components.search.study import TrialOutcome

TOKEN_FACTOR = {"complete": 1.0, "debate": 1.25, "star": 0.7, "chain": 0.55, "layered": 0.65, "custom": 1.0}
"""Relative message volume per topology (debate re-reads everything; chain passes one message on)."""
ACCURACY_BONUS = {"complete": 0.04, "debate": 0.06, "star": 0.02, "chain": 0.0, "layered": 0.03, "custom": 0.0}


def synthetic_outcome(cfg: Config, seconds: float = 0.0) -> TrialOutcome:
    """Accuracy and token use as smooth functions of the searched parameters of ``cfg``."""
    m, r, lam = cfg.mas.agents, cfg.mas.rounds, cfg.reward.lambda_tok
    topo = cfg.mas.topology
    per_message = 90.0 / (1.0 + 4.0 * lam)  # tokens per message shrink with the token penalty
    target_pull = 0.8 + 0.2 * min(1.0, cfg.budget.target / 400.0)  # the dual controller steers to B
    mean_tokens = m * r * per_message * TOKEN_FACTOR[topo] * target_pull
    accuracy = (0.25 + 0.12 * math.log2(m) + 0.06 * (r - 1) + ACCURACY_BONUS[topo] - 0.08 * lam
                - 0.05 * abs(math.log10(cfg.gspo.lr) + 6.0) + 0.02 * math.log2(cfg.gspo.group_size / 4.0)
                - 50.0 * abs(cfg.gspo.eps_low - EPS_LOW))
    episodes = cfg.search.trial_steps * cfg.gspo.questions_per_step * cfg.gspo.group_size + cfg.search.dev_items
    accuracy = min(1.0, max(0.0, accuracy))
    return TrialOutcome(dev_accuracy=accuracy, mean_tokens_per_episode=mean_tokens,
                        tokens_spent=int(round(mean_tokens * episodes)), seconds=seconds,
                        items=synthetic_items(accuracy, mean_tokens, 2 * cfg.search.dev_items))


def synthetic_items(accuracy: float, tokens: float, n: int) -> dict[str, list[ItemScore]]:
    """``n`` dev items at ``accuracy``: item ``i`` is correct when ``frac(i * golden ratio) < accuracy``
    (evenly spread, and a more accurate point answers every item a less accurate one does)."""
    return {"synthetic": [ItemScore(f"dev-{i}", (i * 0.6180339887498949) % 1.0 < accuracy, tokens)
                          for i in range(n)]}


@dataclass
class SyntheticTrial:
    """``trial_fn`` for :func:`components.search.run_search`; ``sleep_s`` simulates training time."""

    sleep_s: float = 0.0

    def __call__(self, cfg: Config, trial: optuna.Trial) -> TrialOutcome:
        t0 = time.perf_counter()
        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        return synthetic_outcome(cfg, seconds=time.perf_counter() - t0)
