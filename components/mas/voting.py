"""Voting: the team's final answer from an episode's messages (the step after the rollout).

Rules (``mas.aggregation``):

* ``majority``: the most frequent answer among the voters' messages, answers read by
  :func:`components.scoring.grader.extract` (the same reader grading uses, with the item's
  options, so an option written out in words votes for its letter); ties go to the earliest
  agent; the final answer is that agent's full text. A message with no readable answer does not
  vote. Voters: under the ``adaptive`` protocol each agent's latest non-silent
  message (silence is an abstention, and an agent not prompted again keeps its last answer);
  under ``broadcast`` the last round's non-silent messages.
* ``decision_agent``: the decider's text (agent id N, one extra turn) unless it was silent or
  empty, else the majority vote.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from components.config import MasConfig
from components.data.item import Item
from components.mas.records import Episode, Message
from components.scoring.grader import extract


def voters(episode: Episode, cfg: MasConfig) -> list[Message]:
    """The messages that vote (see the module docstring), one per agent at most."""
    spoken = [m for m in episode.messages if m.agent_id < cfg.agents and not m.silent]
    if cfg.protocol == "broadcast":
        return [m for m in spoken if m.round == cfg.rounds - 1]
    latest: dict[int, Message] = {}
    for m in spoken:  # messages are in call order: the last one per agent wins
        latest[m.agent_id] = m
    return [latest[a] for a in sorted(latest)]


def majority(item: Item, messages: Sequence[Message]) -> tuple[str, str | None]:
    """``(winning message text, its answer)``; ``("", None)`` when no message gives an answer."""
    answers = [(m, extract(item, m.text)) for m in messages]
    answers = [(m, a) for m, a in answers if a is not None]
    if not answers:
        return "", None
    counts = Counter(a for _, a in answers)
    top = max(counts.values())
    winner = min((m.agent_id, m.round, m.text, a) for m, a in answers if counts[a] == top)
    return winner[2], winner[3]


def final_answer(episode: Episode, item: Item, cfg: MasConfig) -> str:
    """The episode's final answer text under ``cfg.aggregation`` (see the module docstring)."""
    if cfg.aggregation == "decision_agent":
        decider = [m for m in episode.messages if m.agent_id == cfg.agents]
        if decider and not decider[-1].silent and decider[-1].text.strip():
            return decider[-1].text
    return majority(item, voters(episode, cfg))[0]


def vote(episodes: Sequence[Episode], items: Sequence[Item], cfg: MasConfig) -> None:
    """Set ``final_answer`` of every episode (``items`` in the same order as the episodes)."""
    for episode, item in zip(episodes, items, strict=True):
        episode.final_answer = final_answer(episode, item, cfg)
