"""The rollout job: play a few multi-agent episodes and return them with their transcripts.

A command to *look at* episodes (what the policy says, who falls silent, what it costs), not to
measure: all ``limit x group_size`` episodes decode as one batch, so their number is capped by
:data:`ROLLOUT_MAX_EPISODES`; ``agent-gspo evaluate`` runs larger numbers in batches. Rewards are
applied with ``reward.lambda_tok`` so the transcript shows what training would score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from components.config import ConfigError, format_errors
from components.data.prepare import load_split
from components.data.train_items import load_train_items
from components.errors import UserError
from components.io import check_output_file, write_text_atomic
from components.jobs.base import ROLLOUT_MAX_EPISODES, Job, log
from components.mas.engine import RolloutEngine
from components.mas.environment import Environment
from components.mas.prior import apply_silence_prior
from components.mas.records import Episode
from components.mas.transcript import episodes_summary, format_transcript
from components.models import load_policy
from components.reward.reward import apply_rewards


@dataclass(frozen=True)
class RolloutResult:
    """The episodes played, one readable transcript per episode, and their means (``summary``:
    :func:`components.mas.transcript.episodes_summary` plus the decoding speed)."""

    episodes: list[Episode]
    transcripts: list[str]
    summary: dict[str, float]
    json_path: Path | None


class RolloutJob(Job):
    """``agent-gspo rollout``; see the module docstring."""

    KIND = "rollout"
    benchmark: str = Field(description="benchmark whose prepared split is played")
    split: str = Field("test", description="prepared split")
    limit: int = Field(8, ge=1, description="questions (first N of the split)")
    group_size: int = Field(1, ge=1, description="episodes per question")
    agents: int | None = Field(None, ge=1, description="mas.agents for this rollout")
    rounds: int | None = Field(None, ge=1, description="mas.rounds for this rollout")
    topology: Literal["complete", "chain", "star", "layered", "debate"] | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1)
    greedy: bool = False
    silence_prior: bool = Field(False, description="apply model.silence_prior at load, as train does at step 0")
    data: str | None = Field(None, description="prepared data folder (default data.out_dir)")
    json_out: str | None = Field(None, description="write episode records (JSON lines) here")

    def run(self) -> RolloutResult:
        cfg = self._with_mas_options()
        if self.limit * self.group_size > ROLLOUT_MAX_EPISODES:
            raise UserError(f"--limit {self.limit} x --group-size {self.group_size} = {self.limit * self.group_size} "
                            f"episodes in one batch; at most {ROLLOUT_MAX_EPISODES} (use `agent-gspo evaluate` "
                            "for more)")
        if self.json_out:
            check_output_file(self.json_out, "episode records (--json)")
        data_dir = Path(self.data or cfg.data.out_dir)
        items = load_split(data_dir, self.benchmark, self.split, cfg.data)[: self.limit]
        model, tok = load_policy(cfg.model.name, cache_dir=cfg.model.cache_dir, dtype=cfg.model.dtype,
                                 silence_marker=cfg.mas.silence_marker)
        if self.silence_prior:  # the policy train starts from (step 0): the base model plus the silence row
            if cfg.model.silence_prior <= 0:
                raise UserError("--silence-prior: model.silence_prior is 0 in this config; set it (e.g. --set "
                                "model.silence_prior=0.1) or choose a profile that does (results, proof)")
            reached = apply_silence_prior(model, tok, cfg.mas, load_train_items(cfg, data_dir),
                                          cfg.model.silence_prior, cfg.model.silence_calibration)
            log.info("silence prior: P(silence first) = %.3f (model.silence_prior %s)", reached,
                     cfg.model.silence_prior)
        elif cfg.model.silence_prior > 0:
            log.warning("note: the policy runs as loaded; model.silence_prior %s is applied by `train` at step 0 "
                        "(and by evaluation's mas_prior), here only with --silence-prior", cfg.model.silence_prior)
        engine = RolloutEngine(model, tok, cfg.mas)
        episodes = Environment(engine).play(items, self.group_size, seed=self.seed, greedy=self.greedy)
        apply_rewards(episodes, cfg.reward, cfg.reward.lambda_tok)
        summary = episodes_summary(episodes) | {"generated_tokens_per_s": engine.last_stats.tokens_per_s}
        json_path = None
        if self.json_out:
            json_path = Path(self.json_out)
            write_text_atomic(json_path, "".join(json.dumps(ep.to_dict()) + "\n" for ep in episodes))
        return RolloutResult(episodes, [format_transcript(ep, tok) for ep in episodes], summary, json_path)

    def _with_mas_options(self):
        """The config with ``--agents/--rounds/--topology`` applied and the ``mas`` section re-validated
        (e.g. more agents than the topology's adjacency allows is a ConfigError naming the flags)."""
        update = {k: v for k, v in (("agents", self.agents), ("rounds", self.rounds), ("topology", self.topology))
                  if v is not None}
        if not update:
            return self.cfg
        mas = self.cfg.mas.model_copy(update=update)
        try:
            return self.cfg.model_copy(update={"mas": type(self.cfg.mas).model_validate(mas.model_dump())})
        except ValidationError as exc:
            raise ConfigError(format_errors(exc, "--agents/--rounds/--topology")) from exc
