"""Held-out silence per benchmark and by condition: what a pooled (agent, round) grid cannot show.

A team whose second and third agents are silent on nearly every item before anyone has answered has
collapsed to one agent; a team that learnt *when* to be silent is silent more often after an
answer exists, or after the others' answers agree, than before any answer or after they differ.
The pooled grid (:func:`components.evaluation.metrics.silence_grid`) mixes benchmarks and
conditions, so the evaluation also records, per multi-agent system:

* the grid per benchmark (a collapse on one kind of question is not averaged away);
* per agent ``[silent, sent]`` counts of round-0 turns taken before any answer existed and after
  one (only in-turn orders have the latter: a ``simultaneous`` round 0 hears nothing), and of
  round-1 turns after round-0 answers that all agreed against answers that differed.

An answer is a non-silent message from which the benchmark's grader extracts one
(:func:`components.scoring.grader.extract`; it never reads the gold answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from components.data.item import Item
from components.evaluation.metrics import EpisodeLike, SilenceGrid, silence_grid
from components.scoring.grader import extract


@dataclass
class SilenceContent:
    """Per agent ``[silent, sent]`` turns by condition (lists indexed by agent id)."""

    turn_order: str
    round0_no_answer: list[list[int]]
    round0_after_answer: list[list[int]]
    round1_agreed: list[list[int]]
    round1_disagreed: list[list[int]]


def _add(counts: list[list[int]], agent: int, silent: bool) -> None:
    counts[agent][0] += int(silent)
    counts[agent][1] += 1


def silence_content(pairs: Sequence[tuple[Item, EpisodeLike]], agents: int, turn_order: str) -> SilenceContent:
    """Count each agent's round-0 and round-1 turns of ``pairs`` (item, its episode) by condition."""
    c = SilenceContent(turn_order, *([[0, 0] for _ in range(agents)] for _ in range(4)))
    for item, episode in pairs:
        answers: list[str] = []
        for m in (m for m in episode.messages if m.round == 0 and m.agent_id < agents):
            # messages are recorded in speaking order; under simultaneous no round-0 turn hears another
            exists = turn_order != "simultaneous" and bool(answers)
            _add(c.round0_after_answer if exists else c.round0_no_answer, m.agent_id, m.silent)
            if not m.silent and (answer := extract(item, m.text)) is not None:
                answers.append(answer)
        if len(answers) < 2:
            continue  # agreement needs two answers
        bucket = c.round1_agreed if len(set(answers)) == 1 else c.round1_disagreed
        for m in episode.messages:
            if m.round == 1 and m.agent_id < agents:
                _add(bucket, m.agent_id, m.silent)
    return c


def silence_details(episodes: Mapping[str, Sequence[EpisodeLike]], items: Mapping[str, Mapping[str, Item]],
                    system: str, agents: int, rounds: int, turn_order: str
                    ) -> tuple[dict[str, SilenceGrid], SilenceContent]:
    """One system's grid per benchmark and its content counts over all benchmarks (``episodes``:
    benchmark -> its episodes; ``items``: benchmark -> item id -> item)."""
    grids = {b: silence_grid(system, eps, agents, rounds) for b, eps in episodes.items()}
    pairs = [(items[b][e.question_id], e) for b, eps in episodes.items() for e in eps]
    return grids, silence_content(pairs, agents, turn_order)
