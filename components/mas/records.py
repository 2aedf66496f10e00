"""Episode records returned by the rollout engine, and filled in by the steps after it.

Token ids end to end: every count below is computed from the ids the policy generated, never by
re-tokenising text. ``prompt_ids`` is kept so the trainer can recompute log-probs of exactly the
sequence the behaviour policy saw; it is left out of ``to_dict(compact=True)``.

Who fills what (each field is written by exactly one step, see docs/architecture.md):

* the rollout engine (:mod:`components.mas.engine`) creates the episode and its messages;
* voting (:mod:`components.mas.voting`) sets ``final_answer``;
* grading (:mod:`components.scoring.grader`, via :mod:`components.mas.environment`) sets ``grade``;
* the reward (:mod:`components.reward.reward`) sets ``reward``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from components.scoring.result import Graded, ScoreResult

TOKEN_MEASURES = ("completion", "communicated", "total")
"""what ``reward.token_measure`` may count (the reward's token term, the budget's B)"""


def measured_tokens(counts: Any, measure: str) -> int | None:
    """``counts``' tokens under ``measure`` (a :class:`Message` or an :class:`Episode`: its
    ``<measure>_tokens``), or None for an unknown measure (each caller names its own key)."""
    return getattr(counts, f"{measure}_tokens") if measure in TOKEN_MEASURES else None


class EpisodeReward(Protocol):
    """What the records need of the reward set on an episode: the reward layer's
    :class:`components.reward.reward.RewardBreakdown` (a protocol here because the reward reads
    these records, so the records may not import it: docs/architecture.md, "Layers")."""

    total: float
    repetition: float

    def parts(self) -> dict[str, float]: ...


@dataclass
class Message:
    """One agent turn: a GSPO "sequence"."""

    question_id: str
    group_index: int
    """which of the G sampled episodes of this question"""
    agent_id: int
    role: str
    round: int
    prompt_ids: list[int]
    """token ids of the full prompt the agent saw (chat template applied)"""
    completion_ids: list[int]
    """generated token ids, EOS included when generated, padding excluded"""
    logprobs: list[float]
    """behaviour-policy log-prob of each completion id (same length as completion_ids)"""
    silent: bool
    """the reply was the silence token (or empty): not delivered, no communication cost"""
    recipients: list[int] = field(default_factory=list)
    """agents this message was delivered to (empty when silent)"""
    text: str = ""
    """decoded completion, for transcripts and answer extraction only"""
    private: bool = False
    """this agent was given the item's private fact (split-information items)"""
    silence_prob: float = 0.0
    """probability the policy gave the silence token as this reply's first token (exploration rate)"""
    silence_allowed: bool = True
    """the reply could be silent (False: ``mas.must_answer``'s agent 0 in round 0, whose first token
    could be neither the silence token, EOS nor whitespace); the trainer masks where the decoder did"""
    truncated: bool = False
    """cut by the message cap (``mas.max_message_tokens``) before its EOS: what "cap hit" counts (a
    silent reply, or one whose EOS fell exactly on the cap, was not cut)"""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.completion_ids)

    @property
    def communicated_tokens(self) -> int:
        """k tokens delivered to r recipients cost k*r."""
        return 0 if self.silent else self.completion_tokens * len(self.recipients)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Episode(Graded):
    """One multi-agent episode on one question (one of the G samples of a group)."""

    question_id: str
    group_index: int
    benchmark: str
    messages: list[Message]
    calls_skipped: int = 0
    """agent turns the protocol did not prompt (retired by silence, or nothing new to read)"""
    final_answer: str = ""
    """the aggregated answer text, set by voting"""
    grade: ScoreResult | None = None
    """set by grading; None until then"""
    reward: EpisodeReward | None = None
    """set by the reward step; None until then"""

    @property
    def prompt_tokens(self) -> int:
        return sum(m.prompt_tokens for m in self.messages)

    @property
    def completion_tokens(self) -> int:
        return sum(m.completion_tokens for m in self.messages)

    @property
    def communicated_tokens(self) -> int:
        return sum(m.communicated_tokens for m in self.messages)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def turns(self) -> int:
        """non-silent messages"""
        return sum(not m.silent for m in self.messages)

    @property
    def silence_rate(self) -> float:
        return sum(m.silent for m in self.messages) / max(1, len(self.messages))

    def tokens(self, measure: str) -> int:
        """Token count under a measure: completion | communicated | total."""
        count = measured_tokens(self, measure)
        if count is None:
            raise ValueError(f"unknown token measure {measure!r} (allowed: {', '.join(TOKEN_MEASURES)})")
        return count

    def to_dict(self, compact: bool = True) -> dict[str, Any]:
        out = asdict(self)
        if compact:
            for m in out["messages"]:
                m["prompt_tokens"] = len(m.pop("prompt_ids"))
        out.update(correct=self.correct, prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                   communicated_tokens=self.communicated_tokens, total_tokens=self.total_tokens,
                   turns=self.turns, silence_rate=self.silence_rate)
        return out
