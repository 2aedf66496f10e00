"""RolloutJob: what `agent-gspo rollout` runs, called as a library (tiny random model, real prepared data)."""

from __future__ import annotations

import json

import pytest
from helpers.paths import REPO_ROOT

from components.config import ConfigError, load_config
from components.errors import UserError
from components.jobs import RolloutJob
from components.jobs.base import JobOptionError

ROOT = REPO_ROOT
TINY = ["model.name=tiny-random", "mas.max_message_tokens=6"]


@pytest.fixture(scope="module")
def cfg():
    return load_config(ROOT / "params.yaml", None, TINY)


def test_rollout_returns_every_episode_its_transcript_and_the_records(cfg, prepared_data, tmp_path, one_thread):
    out = tmp_path / "episodes.jsonl"
    result = RolloutJob(cfg=cfg, benchmark="svamp", limit=2, group_size=2, agents=2, rounds=2,
                        data=str(prepared_data), json_out=str(out)).run()
    assert len(result.episodes) == len(result.transcripts) == 4
    assert all("round 2" in t for t in result.transcripts)
    assert all(len(ep.messages) == 4 for ep in result.episodes)  # the --agents/--rounds options, not cfg.mas's
    assert result.json_path == out
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["messages"] for r in records] == [ep.to_dict()["messages"] for ep in result.episodes]
    assert 0.0 <= result.summary["silence_rate"] <= 1.0 and result.summary["generated_tokens_per_s"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["episodes.jsonl"]  # no temporary file left beside it


def test_too_many_episodes_fail_before_the_model_loads(cfg, tmp_path):
    """The cap is checked first: a broken model name must not be what the user hears about."""
    broken = cfg.model_copy(update={"model": cfg.model.model_copy(update={"name": "/nonexistent/model"})})
    with pytest.raises(UserError, match=r"--limit 3 x --group-size 100 = 300 episodes in one batch; at most 256"):
        RolloutJob(cfg=broken, benchmark="gsm8k", limit=3, group_size=100, data=str(tmp_path)).run()


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"limit": 0}, JobOptionError, r"rollout: invalid option\(s\): limit"),
    ({"topology": "ring"}, JobOptionError, r"topology"),
    ({"seed": 2**32}, JobOptionError, r"seed"),
    ({"agents": 17}, ConfigError, r"--agents/--rounds/--topology"),
])
def test_options_outside_the_schema_name_the_option(cfg, tmp_path, options, error, match):
    with pytest.raises(error, match=match):
        RolloutJob(cfg=cfg, benchmark="gsm8k", data=str(tmp_path), **options).run()
