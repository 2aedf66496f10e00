"""The environment the trainer and the CLI play in: rollout -> vote -> grade, one step each.

``Environment.play`` returns graded episodes; the reward is the trainer's step (it needs λ_tok).
A custom ``judge`` replaces grading (the learning-proof tests judge episodes by who spoke), and
evaluation calls the same three steps itself so it can grade every system's episodes in one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from components.data.item import Item, as_items
from components.mas.engine import RolloutEngine
from components.mas.records import Episode
from components.mas.voting import vote

Judge = Callable[[Sequence[Item], Sequence[Episode]], None]
"""sets ``episode.grade`` for every (item, episode) pair"""


def grade_episodes(items: Sequence[Item], episodes: Sequence[Episode], *, timeout_s: float = 10.0) -> None:
    """Grade each episode's final answer against its item with the one grader."""
    from components.scoring.grader import grade_many  # lazy: math-verify and the sandbox are heavy

    results = grade_many([(item, ep.final_answer) for item, ep in zip(items, episodes, strict=True)],
                         timeout_s=timeout_s)
    for ep, res in zip(episodes, results, strict=True):
        ep.grade = res


class Environment:
    """Rollout with ``engine``, vote with its settings, then ``judge`` (default: the grader)."""

    def __init__(self, engine: RolloutEngine, judge: Judge | None = None) -> None:
        self.engine = engine
        self.judge = judge or grade_episodes

    @property
    def last_stats(self) -> Any:
        return self.engine.last_stats

    def play(self, items: Sequence[Item], group_size: int, *, seed: int, greedy: bool = False) -> list[Episode]:
        """``len(items) * group_size`` graded episodes, question-major."""
        items = as_items(list(items), "items")
        episodes = self.engine.rollout(items, group_size, seed=seed, greedy=greedy)
        per_episode = [item for item in items for _ in range(group_size)]
        vote(episodes, per_episode, self.engine.cfg)
        self.judge(per_episode, episodes)
        return episodes
