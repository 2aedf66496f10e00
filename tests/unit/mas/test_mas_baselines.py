"""Baselines configure the same engine; transcripts and summaries read the episodes correctly."""

import pytest
import torch

from components.config import MasConfig
from components.data.item import Item
from components.errors import UserError
from components.mas.baselines import BaselineRun, baseline_engine, run_baseline
from components.mas.records import Episode, Message
from components.mas.transcript import episodes_summary, format_transcript
from components.models.tiny import build_tiny_model
from components.scoring.result import ScoreResult


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_tiny_model(seed=1)
    torch.set_num_threads(threads)


ITEMS = [Item(id="b/0", benchmark="aqua", split="test", question="Pick", choices=("1", "2"), answer="A",
              answer_type="choice")]
KW: dict = {}


def test_single_cot_is_one_turn(tiny):
    cfg = MasConfig(agents=4, rounds=3, max_message_tokens=8)
    eps = run_baseline("single_cot", *tiny, cfg, ITEMS, BaselineRun(seed=0))
    assert len(eps) == 1 and len(eps[0].messages) == 1
    m = eps[0].messages[0]
    assert m.recipients == [] and eps[0].communicated_tokens == 0
    assert "<silent>" not in tiny[1].decode(m.prompt_ids)  # lone solver: no silence option


def test_self_consistency_samples_k_independent_answers(tiny):
    cfg = MasConfig(agents=2, rounds=2, max_message_tokens=8)
    eng = baseline_engine("self_consistency", *tiny, cfg, k=3, **KW)
    eps = eng.rollout(ITEMS, 1, seed=0)
    ms = eps[0].messages
    assert len(ms) == 3 and eng.last_stats.calls == 1
    assert all(m.recipients == [] for m in ms) and eps[0].communicated_tokens == 0
    assert ms[0].prompt_ids == ms[1].prompt_ids == ms[2].prompt_ids
    with pytest.raises(UserError, match="k must be in 1..16"):
        baseline_engine("self_consistency", *tiny, cfg, k=0)
    with pytest.raises(UserError, match="unknown baseline 'oracle'"):
        baseline_engine("oracle", *tiny, cfg)


def test_mas_untrained_is_free_for_all(tiny):
    cfg = MasConfig(agents=3, rounds=2, topology="chain", max_message_tokens=8)
    eng = baseline_engine("mas_untrained", *tiny, cfg, **KW)
    assert eng.cfg.topology == "complete" and eng.waves == [[0, 1, 2]]
    assert len(eng.rollout(ITEMS, 2, seed=0)[1].messages) == 6


def _episode():
    msgs = [Message("q", 0, 0, "solver", 0, [1] * 10, [5, 6, 7], [-1.0] * 3, False, [1, 2], "The answer is 4"),
            Message("q", 0, 1, "critic", 0, [1] * 12, [9, 2], [-0.5] * 2, True, [], "<silent>"),
            Message("q", 0, 2, "verifier", 1, [1] * 20, [8], [-0.1], False, [], "4")]
    return Episode("q", 0, "gsm8k", msgs, final_answer="The answer is 4", grade=ScoreResult(True, "4", None))


def test_transcript_and_summary():
    ep = _episode()
    text = format_transcript(ep)
    assert "agent 2 (critic) prompt=12 completion=2 SILENT" in text
    assert "-> 2,3 communicated=6" in text and "-> nobody communicated=0" in text
    assert "communicated=6 total=48 turns=2" in text and "correct=True" in text
    bad = Episode("r", 1, "gsm8k", [], final_answer="", grade=ScoreResult(False, None, None))
    s = episodes_summary([ep, bad])
    assert s["episodes"] == 2 and s["accuracy"] == 0.5
    assert s["tokens_communicated"] == 3.0 and s["tokens_completion"] == 3.0 and s["turns"] == 1.0
    assert s["silence_rate"] == pytest.approx(1 / 3)
    assert episodes_summary([]) == {"episodes": 0}
