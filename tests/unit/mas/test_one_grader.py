"""One grader: voting, the training reward, evaluation and `agent-gspo score` judge every answer type
alike, including option texts written out on MMLU and AQuA (before, the reward's vote read choice
answers without the item's options, so "5(√3 + 1)" voted for nothing in training but for (A) in
evaluation)."""

from __future__ import annotations

import json

import pytest
from helpers.prepared import write_prepared

from components.config import Config, MasConfig
from components.data.item import Item
from components.data.prepare import load_split, records_to_table
from components.evaluation.runner import EvalRequest, System, evaluate
from components.mas.environment import Environment
from components.mas.records import Episode, Message
from components.mas.voting import majority
from components.reward.reward import apply_rewards
from components.scoring import score_predictions_file
from components.scoring.grader import extract, grade_many

BENCHMARKS = ["mmlu", "aqua", "gsm8k", "math500", "humaneval"]


def answers(item: Item) -> list[str]:
    """Texts that exercise each reader: right and wrong answers, options as text, prose without an answer."""
    if item.answer_type == "choice":
        gold = "ABCDE".index(item.answer)
        other = (gold + 1) % len(item.choices)
        return [f"I think it is {item.choices[gold]}", f"The answer is ({'ABCDE'[other]})", "no idea",
                item.choices[other]]
    if item.answer_type == "numeric":
        return [f"The answer is {item.answer}", f"#### {float(item.answer) + 1:g}", "hmm"]
    if item.answer_type == "math":
        return [f"so $\\boxed{{{item.answer}}}$", "The answer is 12345", ""]
    return [f"```python\n{item.meta['prompt']}{item.answer}```", "    return None\n"]


class ScriptedEngine:
    """Speaks a fixed text per item (one agent, one round), like a policy that always says it."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.texts, self.cfg = texts, MasConfig(agents=1, rounds=1)

    def rollout(self, items, group_size, *, seed, greedy=False):
        return [Episode(it.id, g, it.benchmark, [Message(it.id, g, 0, "solver", 0, [1], [2], [0.0], False, [],
                                                         self.texts.get(it.id, ""))])
                for it in items for g in range(group_size)]


@pytest.fixture(scope="module")
def cases(prepared_data):
    items = [it for b in BENCHMARKS for it in load_split(prepared_data, b, "test")[:3]]
    return [(it, text) for it in items for text in answers(it)]


def test_vote_reward_evaluation_and_score_agree(cases, prepared_data, tmp_path):
    graded = grade_many(cases)
    assert sum(g.correct for g in graded) >= len({it.id for it, _ in cases})  # every item has a right answer
    assert any(g.correct for (it, t), g in zip(cases, graded, strict=True)
               if it.answer_type == "choice" and t.startswith("I think"))  # option text read as its letter

    # voting reads exactly what grading extracts (code: the program grading runs)
    for (item, text), g in zip(cases, graded, strict=True):
        vote = majority(item, [Message(item.id, 0, 0, "solver", 0, [1], [2], [0.0], False, [], text)])[1]
        assert vote == extract(item, text)
        if item.answer_type != "code":
            assert vote == g.extracted, (item.id, text)

    # the training reward: Environment.play -> vote -> grade -> r_task
    for k in range(max(len(answers(it)) for it, _ in cases)):
        picked = {it.id: t for it, t in cases if answers(it)[k % len(answers(it))] == t}
        items = list(dict.fromkeys(it for it, _ in cases if it.id in picked))
        episodes = Environment(ScriptedEngine(picked)).play(items, 1, seed=0)
        apply_rewards(episodes, Config().reward, 0.0)
        expect = {(it.id, t): g.correct for (it, t), g in zip(cases, graded, strict=True)}
        for it, ep in zip(items, episodes, strict=True):
            assert ep.reward.task == float(expect[(it.id, picked[it.id])]), (it.id, picked[it.id])

    # evaluation and `agent-gspo score` on a data folder of these items: the same correct counts
    data = tmp_path / "data"
    for k in range(max(len(answers(it)) for it, _ in cases)):
        texts = {it.id: answers(it)[k % len(answers(it))] for it, _ in cases}
        by_bench = {b: list(dict.fromkeys(it for it, _ in cases if it.benchmark == b)) for b in BENCHMARKS}
        for b, its in by_bench.items():
            (data / b).mkdir(parents=True, exist_ok=True)
            write_prepared(data, b, "test", records_to_table([it.to_record() for it in its]))
        cfg = Config.model_validate({"eval": {"benchmarks": BENCHMARKS, "baselines": [], "batch_size": 4}})
        report = evaluate(cfg, EvalRequest(limit=None, data_dir=data, out_dir=tmp_path / "eval"),
                          systems=[System("agent_gspo", ScriptedEngine(texts))])
        for b, its in by_bench.items():
            direct = sum(g.correct for g in grade_many([(it, texts[it.id]) for it in its]))
            preds = tmp_path / f"{b}.jsonl"
            preds.write_text("".join(json.dumps({"id": it.id, "prediction": texts[it.id]}) + "\n" for it in its))
            scored = score_predictions_file(its, preds, None)["correct"]
            evaluated = next(r.correct for r in report.table if r.benchmark == b)
            assert direct == scored == evaluated, (b, k)
