"""Per-item teams (splitinfo2: team size, informed set and note line per agent) and round-0 turn
order (``mas.turn_order: round0_in_turn``): who is prompted, what each prompt holds (token ids),
and that the token accounting holds. The simultaneous default is pinned to the ids it gave before
either existed."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from components.config import MasConfig
from components.data.item import Item
from components.data.splitinfo_v2 import generate_split
from components.mas.baselines import baseline_engine
from components.mas.engine import RolloutEngine, RolloutInputError, episode_team
from components.mas.environment import Environment
from components.mas.roles import user_prompt
from components.mas.teams import Seating
from components.models.tiny import build_tiny_model

ITEM = Item(id="t/0", benchmark="gsm8k", question="What is 2 + 3?", answer="5", answer_type="numeric")
FACT = Item(id="s/1", benchmark="splitinfo", question="The code was 1111. What is the code now?", answer="1234",
            answer_type="numeric", meta={"private": "The new code is 1234."})


def team_item(team: int, informed: list[int], *, note_first: bool = False, item_id: str = "v2/0") -> Item:
    notes = ["Note: the new code is 4321." if a in informed else ("Note: nothing." if a % 2 else None)
             for a in range(team)]
    return Item(id=item_id, benchmark="splitinfo2", question="The code was 1111. What is the code now?",
                answer="4321", answer_type="numeric",
                meta={"private": "the new code is 4321.", "agents": team, "informed": informed, "notes": notes,
                      "note_first": note_first})


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_tiny_model(seed=0)
    torch.set_num_threads(threads)


def _fingerprint(episodes) -> str:
    rows = [[m.agent_id, m.round, m.prompt_ids, m.completion_ids, m.silent, m.private, m.recipients]
            for e in episodes for m in e.messages]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_simultaneous_gives_the_ids_it_gave_before_turn_order_and_teams_existed():
    """Measured at 71bfd1a (before round0_in_turn and per-item teams): same items, seed and tiny model."""
    for protocol in ("adaptive", "broadcast"):
        model, tok = build_tiny_model(seed=0)
        engine = RolloutEngine(model, tok, MasConfig(agents=3, rounds=2, max_message_tokens=6, protocol=protocol))
        episodes = engine.rollout([ITEM, FACT], 2, seed=0)
        assert sum(len(e.messages) for e in episodes) == 24
        assert _fingerprint(episodes) == "5f5207406305eb1145dd1885d5378da1324aba356c0219e8c5a676160934391a"


def test_round0_in_turn_lets_later_agents_hear_earlier_round0_ids(tiny):
    cfg = MasConfig(agents=3, rounds=2, max_message_tokens=6, turn_order="round0_in_turn", protocol="broadcast")
    engine = RolloutEngine(*tiny, cfg)
    assert engine.first_waves == [[0], [1], [2]] and engine.waves == [[0, 1, 2]]
    episodes = engine.rollout([ITEM, FACT], 2, seed=0)
    stats = engine.last_stats
    assert stats.calls == 4  # three round-0 calls, one simultaneous round-1 call
    for ep in episodes:
        first = {m.agent_id: m for m in ep.messages if m.round == 0}
        eos = tiny[1].eos_token_id
        bodies = {a: m.completion_ids[:-1] if m.completion_ids[-1] == eos else m.completion_ids
                  for a, m in first.items()}
        # agent 2's round-0 prompt holds agents 0's and 1's generated ids themselves (not re-tokenised text)
        assert _contains(first[2].prompt_ids, bodies[0]) and _contains(first[2].prompt_ids, bodies[1])
        assert _contains(first[1].prompt_ids, bodies[0]) and not _contains(first[1].prompt_ids, bodies[2])
        assert first[0].recipients == [1, 2] and 2 in first[1].recipients  # agent 0 reads agent 2 in round 1
        assert ep.prompt_tokens == sum(len(m.prompt_ids) for m in ep.messages)
        assert len(ep.messages) + ep.calls_skipped == cfg.rounds * cfg.agents
    generated = sum(len(m.completion_ids) for ep in episodes for m in ep.messages)
    assert generated == stats.generated_tokens


def test_round0_in_turn_under_the_adaptive_protocol_asks_only_who_has_something_new(tiny):
    cfg = MasConfig(agents=3, rounds=2, max_message_tokens=6, turn_order="round0_in_turn")
    engine = RolloutEngine(*tiny, cfg)
    ep = engine.rollout([ITEM], 1, seed=0)[0]
    assert [(m.agent_id, m.round) for m in ep.messages if m.round == 0] == [(0, 0), (1, 0), (2, 0)]
    # round 1: agent 2 (the last) read every round-0 message already; agents 0 and 1 have news
    second = [m.agent_id for m in ep.messages if m.round == 1]
    assert 2 not in second and len(ep.messages) + ep.calls_skipped == 6


def test_an_item_plays_its_own_team_and_informed_set(tiny):
    engine = RolloutEngine(*tiny, MasConfig(agents=5, rounds=2, max_message_tokens=4, protocol="broadcast"))
    small, none_informed = team_item(2, [1]), team_item(4, [], item_id="v2/1")
    pair = team_item(3, [0, 2], note_first=True, item_id="v2/2")
    episodes = Environment(engine).play([small, none_informed, pair], 2, seed=0)
    tok = tiny[1]
    for ep, item in zip(episodes, [small] * 2 + [none_informed] * 2 + [pair] * 2, strict=True):
        team, informed = item.meta["agents"], set(item.meta["informed"])
        assert {m.agent_id for m in ep.messages} == set(range(team))  # padding agents never speak
        assert ep.calls_skipped == 0 and len(ep.messages) == 2 * team  # and are not skipped turns
        for m in ep.messages:
            text = tok.decode(m.prompt_ids)
            assert m.private == (m.agent_id in informed) and ("4321" in text) == m.private
            assert f"agent {m.agent_id + 1} of {team} " in text
            note = item.meta["notes"][m.agent_id]
            assert (note is None) == ("Note:" not in text)
    line = user_prompt(pair, holds_fact=True, agent=0)
    assert line.startswith("Note: the new code is 4321.\nQuestion:")
    assert user_prompt(small, agent=0) == "Question: The code was 1111. What is the code now?"
    assert user_prompt(small, agent=1).endswith("\nNote: the new code is 4321.")


def test_generated_v2_items_run_and_calibrate_with_their_own_teams(tiny):
    items = [Item.from_record(r) for r in generate_split("test", n=4)]
    engine = RolloutEngine(*tiny, MasConfig(agents=6, rounds=1, max_message_tokens=3))
    episodes = engine.rollout(items, 1, seed=0)
    for ep, item in zip(episodes, items, strict=True):
        assert len(ep.messages) + ep.calls_skipped == item.meta["agents"]
        assert {m.agent_id for m in ep.messages if m.private} <= set(item.meta["informed"])
    # one prompt per agent of each item's own team (its informed set fixed): the silence prior's calibration set
    assert len(engine.first_round_prompts(items)) == sum(i.meta["agents"] for i in items)


def test_a_team_the_engine_cannot_seat_is_named():
    with pytest.raises(RolloutInputError, match=r"item v2/0: meta.agents=6 must be a team size in 1..mas.agents=5"):
        episode_team(team_item(6, [0]), 0, 5)
    with pytest.raises(RolloutInputError, match=r"meta.informed=\[3\] must be agents in 0..2"):
        episode_team(team_item(3, [3]), 0, 5)
    assert episode_team(FACT, 1, 3).team == 3 and len(episode_team(FACT, 1, 3).informed) == 1
    assert episode_team(ITEM, 0, 3) == Seating(3, frozenset(), (0, 1, 2))


def test_lone_solvers_read_the_fact_whenever_anyone_is_informed(tiny):
    """single_cot and self-consistency on team items: each solver holds the fact when the item is
    answerable (as a lone agent on a version-1 item always does), else reads agent 0's note."""
    pair, nobody = team_item(3, [2], item_id="v2/3"), team_item(4, [], item_id="v2/4")
    assert episode_team(pair, 0, 1, solo=True) == Seating(1, frozenset({0}), (2,))
    assert episode_team(nobody, 0, 2, solo=True) == Seating(2, frozenset(), (0, 0))
    for name, k in (("single_cot", 1), ("self_consistency", 3)):
        engine = baseline_engine(name, *tiny, MasConfig(agents=3, rounds=1, max_message_tokens=3), k=k)
        answerable, blind = engine.rollout([pair, nobody], 1, seed=0)
        assert len(answerable.messages) == k and all(m.private for m in answerable.messages)
        assert all("4321" in tiny[1].decode(m.prompt_ids) for m in answerable.messages)
        assert not any(m.private or "4321" in tiny[1].decode(m.prompt_ids) for m in blind.messages)
