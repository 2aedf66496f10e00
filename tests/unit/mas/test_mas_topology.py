"""Topologies, DAG waves, roles and deterministic context truncation (no model needed)."""

import pytest

from components.data.item import Item
from components.errors import UserError
from components.mas.context import PromptBuilder, truncate_blocks
from components.mas.roles import role_names, system_prompt, task_family, user_prompt
from components.mas.topology import build_adjacency, in_neighbours, is_dag, out_neighbours, round_waves


def test_complete_and_debate():
    c = build_adjacency("complete", 3)
    assert c == [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
    assert not is_dag(c) and round_waves(c) == [[0, 1, 2]]
    d = build_adjacency("debate", 3)
    assert all(v == 1 for row in d for v in row)
    assert in_neighbours(d, 1) == [0, 1, 2] and round_waves(d) == [[0, 1, 2]]


def test_chain_star_layered():
    ch = build_adjacency("chain", 4)
    assert [out_neighbours(ch, i) for i in range(4)] == [[1], [2], [3], []]
    assert is_dag(ch) and round_waves(ch) == [[0], [1], [2], [3]]
    st = build_adjacency("star", 4)
    assert out_neighbours(st, 0) == [1, 2, 3] and in_neighbours(st, 0) == [1, 2, 3]
    assert in_neighbours(st, 2) == [0] and not is_dag(st)
    la = build_adjacency("layered", 5)
    assert [out_neighbours(la, i) for i in range(5)] == [[3, 4]] * 3 + [[], []]
    assert round_waves(la) == [[0, 1, 2], [3, 4]]


def test_custom_dag_waves_ignore_self_loops_and_cycles():
    adj = [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert is_dag(adj) and not is_dag(adj, ignore_self_loops=False)
    assert round_waves(adj) == [[0], [1], [2]]
    cyc = [[0, 1, 0], [0, 0, 1], [1, 0, 0]]
    assert not is_dag(cyc) and round_waves(cyc) == [[0, 1, 2]]
    assert round_waves([[0, 0], [0, 0]]) == [[0, 1]]


def test_topology_errors_name_the_problem():
    with pytest.raises(UserError, match="unknown topology 'ring'"):
        build_adjacency("ring", 3)
    with pytest.raises(UserError, match="3x3"):
        build_adjacency("custom", 3, [[0, 1], [1, 0]])
    with pytest.raises(UserError, match=r"adjacency\[0\]\[1\] must be 0 or 1"):
        build_adjacency("custom", 2, [[0, 2], [1, 0]])


def test_truncate_drops_oldest_first_deterministically():
    assert truncate_blocks([10, 20, 30], 100) == [0, 1, 2]
    assert truncate_blocks([10, 20, 30], 50) == [1, 2]
    assert truncate_blocks([10, 20, 30], 49) == [2]
    assert truncate_blocks([10, 20, 60], 50) == []  # newest alone exceeds the budget
    assert truncate_blocks([], 10) == []
    assert all(truncate_blocks([5, 7, 9, 11], 20) == [2, 3] for _ in range(3))


class _FakeTok:
    """Character-level stand-in: one id per character, ChatML-ish template."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def apply_chat_template(self, chat, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}</>" for m in chat) + "<assistant>"


def test_prompt_builder_keeps_newest_blocks_within_budget():
    b = PromptBuilder(_FakeTok(), budget=10, allow_silence=False)
    parts = b.frame("sys", "task")
    assert parts.prefix == [ord(c) for c in "<system>sys</><user>task"]
    assert parts.suffix == [ord(c) for c in "</><assistant>"]
    blocks = [[1] * 6, [2] * 4, [3] * 5]
    ids, kept = b.build(parts, blocks)
    assert kept == [1, 2] and ids == parts.prefix + b.intro + [2] * 4 + [3] * 5 + parts.suffix
    ids0, kept0 = b.build(parts, [])
    assert kept0 == [] and ids0 == parts.prefix + parts.suffix
    team = PromptBuilder(_FakeTok(), budget=10)  # a team member is reminded that it may stay silent
    ids1, _ = team.build(team.frame("sys", "task"), blocks)
    assert ids1[-len(parts.suffix) - len(team.outro):-len(parts.suffix)] == team.outro
    assert "stay silent" in "".join(map(chr, team.outro)) and "<silent>" not in "".join(map(chr, team.outro))


def test_roles_rotate_and_prompts_mention_silence_and_format():
    assert role_names(5) == ["solver", "critic", "verifier", "summariser", "solver"]
    p = system_prompt("maths", "critic", 1, 3)
    assert "agent 2 of 3" in p and "stay silent" in p and "The answer is" in p
    assert "<silent>" not in p  # silence is described in words: the token itself is the policy's action
    assert "silent" not in system_prompt("maths", "solver", 0, 1)
    assert "```python" in system_prompt("code", "solver", 0, 2)
    assert "(L)" in system_prompt("choice", "verifier", 2, 3)
    assert task_family("numeric") == task_family("math") == "maths"
    with pytest.raises(UserError, match="answer_type 'essay'"):
        task_family("essay")
    q = user_prompt(Item(id="x", benchmark="b", question="Pick one", answer="A", answer_type="choice",
                         choices=("red", "blue")))
    assert "(A) red" in q and "(B) blue" in q
    fact = Item(id="s", benchmark="splitinfo", question="What is the code now?", answer="1234", answer_type="numeric",
                meta={"private": "The new code is 1234."})
    assert "The new code is 1234." in user_prompt(fact, holds_fact=True)
    assert "1234" not in user_prompt(fact) and "Private note: none" in user_prompt(fact)
