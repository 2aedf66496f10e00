"""Per (benchmark, system) aggregates of scored episodes, and the accuracy/token Pareto front.

Token vocabulary follows :class:`components.mas.records.Episode` (ids end to end): ``prompt`` =
tokens of every prompt an agent read, ``completion`` = generated tokens (silent replies included),
``communicated`` = delivered tokens x recipients, ``total`` = prompt + completion (what a provider
bills, the paper's "tokens"). ``tokens_per_correct`` is ``tokens_total`` (sum) / correct answers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from components.mas.records import Episode
from components.scoring.result import Graded, ScoreResult

TOKEN_KINDS = ("prompt", "completion", "communicated", "total")


def standard_error(p: float, n: int) -> float:
    """Binomial standard error ``sqrt(p (1 - p) / n)`` of an accuracy ``p`` over ``n`` items (0 for n = 0)."""
    if n <= 0:
        return 0.0
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"standard_error: accuracy must be in [0, 1], got {p}")
    return math.sqrt(p * (1.0 - p) / n)


class EvalNumbers(BaseModel):
    """What one system scored on one benchmark: the one definition of these numbers, used by the
    evaluation table (:class:`EvalRow`) and by experiment results files (``EvalCell``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(ge=0)
    correct: int = Field(ge=0)
    accuracy: float = Field(ge=0.0, le=1.0)
    accuracy_se: float = Field(ge=0.0)
    tokens_prompt: int = Field(ge=0)
    tokens_completion: int = Field(ge=0)
    tokens_communicated: int = Field(ge=0)
    tokens_total: int = Field(ge=0)
    tokens_prompt_mean: float
    tokens_completion_mean: float
    tokens_communicated_mean: float
    tokens_total_mean: float
    tokens_per_correct: float | None
    """tokens_total / correct; None when nothing was correct (undefined, not infinite)"""
    turns: float
    """mean non-silent messages per episode"""
    messages: float
    """mean messages per episode (silent ones included)"""
    silence_rate: float = Field(ge=0.0, le=1.0)
    """silent messages / messages, pooled over the benchmark's episodes"""
    grading_errors: int = Field(ge=0)
    """episodes whose grader failed (timeout, crash, unusable gold) - counted apart from wrong answers"""
    silence_informed: float | None = None
    """split-information items: silent turns / turns of the agent that held the fact (else None)"""
    silence_uninformed: float | None = None
    """split-information items: silent turns / turns of the agents without the fact (else None)"""
    calls_skipped: float = 0.0
    """mean agent turns per episode the protocol did not prompt (silence retired them, or nothing new)"""
    cap_hit_rate: float | None = Field(None, ge=0.0, le=1.0)
    """messages that reached mas.max_message_tokens / messages (None: not measured, e.g. older files)"""


class EvalRow(EvalNumbers):
    """One row of the results table: a system on a benchmark, and its numbers."""

    benchmark: str
    system: str

    def to_dict(self) -> dict:
        return self.model_dump()

    def numbers(self) -> EvalNumbers:
        """The numbers alone, without benchmark and system (a results file's cell)."""
        return EvalNumbers.model_validate(self.model_dump(exclude={"benchmark", "system"}))


@dataclass
class MessageStat:
    """Who spoke when, and whether silently (what silence statistics need from a Message)."""

    agent_id: int
    round: int
    silent: bool
    private: bool = False
    """the agent held the item's private fact"""
    completion_tokens: int = 0
    truncated: bool = False
    """cut by the message cap before its EOS (Message.truncated)"""
    text: str = ""
    """the decoded completion (Message.text, decoded from the engine's ids): the per-item transcript"""


@dataclass
class EpisodeStats(Graded):
    """The numbers of an :class:`Episode` without its token ids.

    A full evaluation holds 14k MMLU episodes x N messages; keeping every ``prompt_ids`` list
    would cost gigabytes, so episodes are compacted right after each rollout batch (the message
    texts stay: they are the per-item record's transcript, see items.py). Same
    attribute names as Episode, so :func:`aggregate` and :func:`silence_grid` take either.
    """

    question_id: str
    final_answer: str
    prompt_tokens: int
    completion_tokens: int
    communicated_tokens: int
    total_tokens: int
    turns: int
    messages: list[MessageStat]
    calls_skipped: int = 0
    grade: ScoreResult | None = None
    """set by grading (evaluation grades the compacted episodes of every system in one batch)"""

    @classmethod
    def from_episode(cls, ep: Episode) -> EpisodeStats:
        return cls(ep.question_id, ep.final_answer, ep.prompt_tokens, ep.completion_tokens, ep.communicated_tokens,
                   ep.total_tokens, ep.turns,
                   [MessageStat(m.agent_id, m.round, m.silent, m.private, m.completion_tokens, m.truncated, m.text)
                    for m in ep.messages],
                   ep.calls_skipped,
                   ep.grade)


EpisodeLike = Episode | EpisodeStats


def aggregate(benchmark: str, system: str, episodes: Sequence[EpisodeLike], cap: int | None = None) -> EvalRow:
    """Fold scored episodes of one (benchmark, system) into an :class:`EvalRow`; ``cap`` (the
    message cap, ``mas.max_message_tokens``) gives ``cap_hit_rate``."""
    n = len(episodes)
    correct = sum(bool(e.correct) for e in episodes)
    acc = correct / n if n else 0.0
    sums = {
        "prompt": sum(e.prompt_tokens for e in episodes),
        "completion": sum(e.completion_tokens for e in episodes),
        "communicated": sum(e.communicated_tokens for e in episodes),
        "total": sum(e.total_tokens for e in episodes),
    }
    n_msgs = sum(len(e.messages) for e in episodes)
    silent = sum(m.silent for e in episodes for m in e.messages)
    capped = sum(m.truncated for e in episodes for m in e.messages) if cap else 0
    return EvalRow(
        benchmark=benchmark, system=system, n=n, correct=correct, accuracy=acc,
        accuracy_se=standard_error(acc, n),
        tokens_prompt=sums["prompt"], tokens_completion=sums["completion"],
        tokens_communicated=sums["communicated"], tokens_total=sums["total"],
        tokens_prompt_mean=sums["prompt"] / n if n else 0.0,
        tokens_completion_mean=sums["completion"] / n if n else 0.0,
        tokens_communicated_mean=sums["communicated"] / n if n else 0.0,
        tokens_total_mean=sums["total"] / n if n else 0.0,
        tokens_per_correct=sums["total"] / correct if correct else None,
        turns=sum(e.turns for e in episodes) / n if n else 0.0,
        messages=n_msgs / n if n else 0.0,
        silence_rate=silent / n_msgs if n_msgs else 0.0,
        grading_errors=sum(e.score_error is not None for e in episodes),
        silence_informed=_silence(episodes, informed=True),
        silence_uninformed=_silence(episodes, informed=False),
        calls_skipped=sum(e.calls_skipped for e in episodes) / n if n else 0.0,
        cap_hit_rate=capped / n_msgs if cap and n_msgs else None,
    )


def _silence(episodes: Sequence[EpisodeLike], informed: bool) -> float | None:
    """Silence rate of the fact holders' (or the others') turns on split-information episodes."""
    split = [e for e in episodes if any(m.private for m in e.messages)]
    turns = [m.silent for e in split for m in e.messages if m.private is informed]
    return sum(turns) / len(turns) if turns else None


def summarise(rows: Sequence[EvalRow]) -> dict[str, dict[str, float | int | None]]:
    """Per-system aggregates over benchmarks (what promotion compares).

    ``accuracy`` is the macro mean over benchmarks (each benchmark weighs the same, as in the
    paper's average column); ``accuracy_micro`` pools items. ``tokens_total`` is the SUM of total
    tokens over all evaluated items (the paper's token figure; candidate and champion must be
    evaluated on the same items, which the seeded sample guarantees); ``tokens_total_mean`` is per item.
    """
    out: dict[str, dict[str, float | int | None]] = {}
    for system in dict.fromkeys(r.system for r in rows):
        mine = [r for r in rows if r.system == system]
        n = sum(r.n for r in mine)
        correct = sum(r.correct for r in mine)
        tokens = sum(r.tokens_total for r in mine)
        msgs = sum(r.messages * r.n for r in mine)
        out[system] = {
            "accuracy": sum(r.accuracy for r in mine) / len(mine),
            "accuracy_micro": correct / n if n else 0.0,
            "n": n, "correct": correct, "benchmarks": len(mine),
            "tokens_total": tokens,
            "tokens_total_mean": tokens / n if n else 0.0,
            "tokens_completion": sum(r.tokens_completion for r in mine),
            "tokens_communicated": sum(r.tokens_communicated for r in mine),
            "tokens_per_correct": tokens / correct if correct else None,
            "silence_rate": sum(r.silence_rate * r.messages * r.n for r in mine) / msgs if msgs else 0.0,
            "grading_errors": sum(r.grading_errors for r in mine),
        }
    return out


@dataclass
class SilenceGrid:
    """Silent / total message counts per (agent, round), pooled over episodes.

    ``silent[a][r]`` and ``total[a][r]`` have shape [agents][rounds]; the decision agent (if any)
    is left out because it speaks once, after the last round.
    """

    system: str
    silent: list[list[int]]
    total: list[list[int]]

    def rates(self) -> list[list[float | None]]:
        """silent / total per cell, None where no message was sent."""
        return [[s / t if t else None for s, t in zip(srow, trow, strict=True)]
                for srow, trow in zip(self.silent, self.total, strict=True)]


def silence_grid(system: str, episodes: Sequence[EpisodeLike], agents: int, rounds: int) -> SilenceGrid:
    """Count silent messages per (agent, round) over ``episodes`` ([agents][rounds] grids)."""
    silent = [[0] * rounds for _ in range(agents)]
    total = [[0] * rounds for _ in range(agents)]
    for e in episodes:
        for m in e.messages:
            if m.agent_id < agents and m.round < rounds:
                total[m.agent_id][m.round] += 1
                silent[m.agent_id][m.round] += int(m.silent)
    return SilenceGrid(system, silent, total)
