"""bench/proof_families.py: the per-family breakdown counts what each item records (scripted
episodes), and the script runs end to end on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from bench.proof_families import breakdown, heard_an_answer, with_ratio
from components.data.item import Item
from components.data.splitinfo_v2 import generate_split
from components.mas.records import Episode, Message
from components.scoring.result import ScoreResult

ROOT = REPO_ROOT


def _episode(item: Item, spoken: dict[int, str], final: str) -> Episode:
    msgs = [Message(item.id, 0, a, "solver", 0, [1, 2], [3] if a not in spoken else [4, 5, 6], [0.0], a not in spoken,
                    [], spoken.get(a, "<silent>"), private=a in item.meta["informed"])
            for a in range(item.meta["agents"])]
    return Episode(item.id, 0, item.benchmark, msgs, final_answer=final,
                   grade=ScoreResult(final.endswith(item.answer), None, None))


def test_breakdown_counts_silence_distractors_and_accuracy_per_group():
    records = generate_split("test", n=60)
    items = [Item.from_record(r) for r in records]
    one = next(i for i in items if len(i.meta["informed"]) == 1 and i.meta["distractor"])
    holder = one.meta["informed"][0]
    decoy = one.meta["note_kinds"].index("distractor")
    value = one.meta["distractor_values"][0]
    # the holder answers; the distractor's holder says its number; everyone else is silent
    spoken = {holder: f"The answer is {one.answer}", decoy: f"The answer is {value}"}
    ep = _episode(one, spoken, f"The answer is {value}")
    out = breakdown([one], [ep])
    everything = out["all"]["all"]
    n_uninformed = one.meta["agents"] - 1
    assert everything["items"] == everything["answerable"] == 1 and everything["accuracy"] == 0.0
    assert everything["silence_informed"] == 0.0
    assert everything["silence_uninformed"] == pytest.approx(round((n_uninformed - 1) / n_uninformed, 4))
    assert everything["distractor_said"] == pytest.approx(round(1 / one.meta["note_kinds"].count("distractor"), 4))
    assert everything["final_distractor"] == 1.0
    assert out["family"][one.meta["family"]]["items"] == 1 and out["team_size"][str(one.meta["agents"])]["items"] == 1
    nobody = next(i for i in items if not i.meta["informed"])
    out = breakdown([nobody], [_episode(nobody, {}, "")])
    assert out["family"] == {"nobody_informed": out["all"]["all"]} and out["all"]["all"]["accuracy"] is None
    assert out["all"]["all"]["silence_uninformed"] == 1.0 and out["all"]["all"]["silence_informed"] is None
    ratio = with_ratio(json.loads(json.dumps(out)), out)
    assert ratio["all"]["all"]["tokens_vs_untrained"] == 1.0


def test_a_lone_solver_is_charged_for_the_note_it_read():
    """A single-agent baseline's solver reads the first informed agent's note: it holds the fact, and a
    distracting number in agent 0's note is not its own (it never saw it)."""
    items = [Item.from_record(r) for r in generate_split("test", n=200)]
    item = next(i for i in items if i.meta["informed"] and i.meta["distractor"]
                and i.meta["note_kinds"][0] == "distractor")
    value = item.meta["distractor_values"][0]
    solo = Episode(item.id, 0, item.benchmark,
                   [Message(item.id, 0, 0, "solver", 0, [1], [4], [0.0], False, [], f"The answer is {value}",
                            private=True)], final_answer=f"The answer is {value}", grade=ScoreResult(False, None, None))
    lone = breakdown([item], [solo], solo_agents=1)["all"]["all"]
    assert lone["silence_informed"] == 0.0 and lone["silence_uninformed"] is None
    assert lone["distractor_said"] is None and lone["final_distractor"] == 1.0
    nobody = next(i for i in items if not i.meta["informed"] and i.meta["note_kinds"][0] == "distractor")
    said = nobody.meta["distractor_values"][0]
    ep = Episode(nobody.id, 0, nobody.benchmark,
                 [Message(nobody.id, 0, 0, "solver", 0, [1], [4], [0.0], False, [], f"It is {said}")],
                 final_answer=f"It is {said}", grade=ScoreResult(False, None, None))
    assert breakdown([nobody], [ep], solo_agents=1)["all"]["all"]["distractor_said"] == 1.0  # agent 0's own note


def _msg(agent: int, rnd: int, silent: bool, recipients: list[int]) -> Message:
    return Message("q", 0, agent, "solver", rnd, [1], [2], [0.0], silent, recipients)


def test_heard_an_answer_follows_the_turn_order():
    """Agent 0 speaks, agent 1 is silent, agent 2 speaks in round 0; in round 1 everyone speaks. Who had
    heard an answer before its turn depends on whether round 0 was simultaneous or in turn."""
    msgs = [_msg(0, 0, False, [1, 2]), _msg(1, 0, True, []), _msg(2, 0, False, [0, 1]),
            _msg(0, 1, False, [1, 2]), _msg(1, 1, False, [0, 2]), _msg(2, 1, False, [0, 1])]
    ep = Episode("q", 0, "splitinfo2", msgs)
    assert heard_an_answer(ep, "simultaneous") == [False, False, False, True, True, True]
    assert heard_an_answer(ep, "round0_in_turn") == [False, True, True, True, True, True]
    assert heard_an_answer(ep, "in_turn") == [False, True, True, True, True, True]
    silent_round0 = Episode("q", 0, "splitinfo2", [_msg(0, 0, True, []), _msg(1, 0, True, []), _msg(0, 1, False, [1]),
                                                   _msg(1, 1, False, [0])])
    # round 1 is simultaneous under every order but in_turn: agent 1 hears agent 0's round-1 message only in turn
    assert heard_an_answer(silent_round0, "round0_in_turn") == [False, False, False, False]
    assert heard_an_answer(silent_round0, "in_turn") == [False, False, False, True]


@pytest.mark.slow
def test_runs_end_to_end_on_the_tiny_model(tmp_path: Path):
    from components.data.prepare import prepare

    prepare(["splitinfo2"], mirror=None, out_dir=tmp_path / "data", progress=False)
    out = tmp_path / "families.json"
    res = subprocess.run([sys.executable, "bench/proof_families.py", "--model", "tiny-random", "--limit", "4",
                          "--model", "again=tiny-random", "--set", "mas.turn_order=round0_in_turn", "--single",
                          "--set", "model.name=tiny-random",
                          "--data", str(tmp_path / "data"), "--out", str(out), "--params", "params.yaml",
                          "--profile", "proof_v2"], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    record = json.loads(out.read_text())
    assert sorted(record["systems"]) == ["again", "self_consistency", "single_cot", "trained"]
    assert record["models"] == {"trained": "tiny-random", "again": "tiny-random", "single_cot": "tiny-random",
                                "self_consistency": "tiny-random"} and record["limit"] == 4
    lone = record["systems"]["single_cot"]["all"]["all"]
    assert lone["items"] == 4 and lone["silence_uninformed_heard"] is None  # one solver hears nobody
    assert record["turn_order"] == "round0_in_turn" and record["overrides"] == ["mas.turn_order=round0_in_turn",
                                                                                        "model.name=tiny-random"]
    assert len(record["item_ids_sha256"]) == 64 and "| group | items |" in res.stdout
    assert record["systems"]["trained"] == record["systems"]["again"]  # greedy: the same policy plays alike
    assert record["systems"]["trained"]["all"]["all"]["items"] == 4


def test_refuses_to_play_nothing():
    res = subprocess.run([sys.executable, "bench/proof_families.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "nothing to play" in res.stderr
    res = subprocess.run([sys.executable, "bench/proof_families.py", "--model", "single_cot=tiny-random"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "reserved for --single" in res.stderr
