"""End-to-end: tiny-random policy, all seven benchmarks, all baselines, two items each, run twice.

Prepares the seven benchmarks from the mirror into a temporary folder first (a few seconds).
"""
import json
from pathlib import Path

import pytest
from helpers.paths import REPO_ROOT

from components.config import BENCHMARKS, Config
from components.evaluation import EvalRequest, evaluate

pytestmark = pytest.mark.e2e
ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def data_dir(prepared_data: Path) -> Path:
    return prepared_data


def _cfg() -> Config:
    return Config.model_validate({
        "model": {"name": "tiny-random"},
        "mas": {"agents": 3, "rounds": 2, "max_message_tokens": 8, "context_tokens": 256},
        "eval": {"limit": 2, "self_consistency_k": 3, "batch_size": 2, "seed": 1234, "code_timeout_s": 5.0},
    })


def test_tiny_random_seven_benchmarks_all_baselines_reproducible(tmp_path, one_thread, data_dir):
    a = evaluate(_cfg(), EvalRequest(data_dir=data_dir, out_dir=tmp_path / "a"))
    b = evaluate(_cfg(), EvalRequest(limit=2, data_dir=data_dir, out_dir=tmp_path / "b"))

    systems = ["agent_gspo", "single_cot", "self_consistency", "mas_untrained"]
    assert [(r.system, r.benchmark) for r in a.table] == [(s, bm) for s in systems for bm in BENCHMARKS]
    assert all(r.n == 2 for r in a.table)
    assert a.table == b.table and a.summary == b.summary  # same inputs -> identical numbers
    assert a.meta["item_ids"] == b.meta["item_ids"] and a.meta["model"] == "tiny-random"
    for r in a.table:
        assert r.tokens_total == r.tokens_prompt + r.tokens_completion > 0
        if r.system in ("single_cot", "self_consistency"):
            assert r.tokens_communicated == 0 and r.silence_rate == 0.0
        assert r.tokens_completion <= 2 * 8 * {"agent_gspo": 6, "mas_untrained": 6, "single_cot": 1,
                                                 "self_consistency": 3}[r.system]
    for name in [f"{bm}.json" for bm in BENCHMARKS] + ["summary.json", "report.md", "accuracy_vs_tokens.png",
                                                        "silence_by_agent_round.png"]:
        assert (tmp_path / "a" / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "a" / "gsm8k.json").read_text()).keys() == set(systems)
    assert (tmp_path / "a" / "report.md").read_text() == (tmp_path / "b" / "report.md").read_text()
    assert a.silence is not None and a.silence.total == [[len(BENCHMARKS) * 2] * 2] * 3
    assert set(a.summary) == set(systems) and "accuracy" in a.summary["agent_gspo"]
