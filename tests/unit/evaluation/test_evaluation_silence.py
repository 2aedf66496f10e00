"""components/evaluation/silence.py: silence by condition (before / after an answer, after agreeing or
differing answers) and per benchmark, counted from the episodes the evaluation already holds."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.data.item import Item
from components.evaluation.metrics import MessageStat
from components.evaluation.silence import silence_content, silence_details


@dataclass
class _Episode:
    question_id: str
    messages: list[MessageStat] = field(default_factory=list)


def _item(i: int) -> Item:
    return Item(id=f"q{i}", benchmark="gsm8k", question="2+2?", answer="4", answer_type="numeric")


def _ep(i: int, round0: list[str | None], round1: list[str | None]) -> _Episode:
    """One message per agent and round, in speaking order; None: a silent message."""
    msgs = [MessageStat(a, r, text is None, text=text or "<silent>")
            for r, texts in enumerate((round0, round1)) for a, text in enumerate(texts)]
    return _Episode(f"q{i}", msgs)


def test_simultaneous_round0_never_follows_an_answer_and_round1_splits_by_agreement():
    pairs = [(_item(0), _ep(0, ["it is 4", "4", None], [None, "4", "4"])),      # agreed: agent 0 silent after
             (_item(1), _ep(1, ["it is 4", "5", "no idea"], ["4", "5", None])),  # differed: agent 2 silent
             (_item(2), _ep(2, ["4", None, None], [None]))]                      # one answer: no agreement
    c = silence_content(pairs, agents=3, turn_order="simultaneous")
    assert c.round0_no_answer == [[0, 3], [1, 3], [2, 3]] and c.round0_after_answer == [[0, 0]] * 3
    assert c.round1_agreed == [[1, 1], [0, 1], [0, 1]]
    assert c.round1_disagreed == [[0, 1], [0, 1], [1, 1]]


def test_in_turn_round0_counts_turns_after_an_earlier_answer():
    pairs = [(_item(0), _ep(0, ["no idea", "4", None], [])),  # agent 0's words hold no answer: agent 1 is "before"
             (_item(1), _ep(1, [None, None, "7"], []))]
    c = silence_content(pairs, agents=3, turn_order="round0_in_turn")
    assert c.round0_no_answer == [[1, 2], [1, 2], [0, 1]]
    assert c.round0_after_answer == [[0, 0], [0, 0], [1, 1]]


def test_details_give_a_grid_per_benchmark():
    items = {"gsm8k": {"q0": _item(0)}, "svamp": {"q1": _item(1)}}
    eps = {"gsm8k": [_ep(0, ["4", None], ["4", None])], "svamp": [_ep(1, [None, None], [])]}
    grids, content = silence_details(eps, items, "agent_gspo", agents=2, rounds=2, turn_order="simultaneous")
    assert grids["gsm8k"].silent == [[0, 0], [1, 1]] and grids["gsm8k"].total == [[1, 1], [1, 1]]
    assert grids["svamp"].silent == [[1, 0], [1, 0]] and grids["svamp"].total == [[1, 0], [1, 0]]
    assert content.round0_no_answer == [[1, 2], [2, 2]]
