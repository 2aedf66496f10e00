"""Communication-aware reward (Agent-GSPO, arXiv 2510.22477):

    R = r_task − λ_tok · tokens / B_norm − λ_turn · turns − λ_rep · repetition

``r_task`` is 1 when the episode's graded final answer is correct, else 0; ``tokens`` is
``episode.tokens(cfg.token_measure)`` (completion, communicated or total tokens of the whole
episode); ``B_norm`` (``cfg.token_norm``) puts the token term on the scale of r_task; ``turns``
counts non-silent messages; ``repetition`` is the mean n-gram overlap of non-silent messages with
earlier ones (0..1). ``λ_tok`` is passed in, not read from the config, because the dual budget
controller steers it during training; it is negative only in budget mode ``target``, where a batch
under B earns a bonus per token (see :mod:`components.reward.budget`).

Per-agent credit (:func:`message_rewards`): every message gets r_task minus its own share of
the cost. The shares add up exactly to the episode's cost, so shaped credit redistributes the
same penalty rather than inventing a new one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from components.config import RewardConfig
from components.errors import UserError
from components.mas.records import TOKEN_MEASURES, Episode, Message, measured_tokens
from components.numbers import finite_float
from components.reward.repetition import episode_repetition, message_repetitions

PART_KEYS = ("task", "tokens_penalty", "turn_penalty", "repetition_penalty", "tokens")
"""the parts logged per episode (``reward/<part>``)"""


class RewardError(UserError):
    """Bad input to the reward (e.g. a negative or non-finite λ_tok)."""


@dataclass(frozen=True)
class RewardBreakdown:
    """One episode's reward and its parts (penalties are positive numbers that are subtracted)."""

    total: float
    """R = task − tokens_penalty − turn_penalty − repetition_penalty"""
    task: float
    """r_task: 1.0 if the episode's final answer is correct, else 0.0"""
    tokens_penalty: float
    """λ_tok · tokens / B_norm"""
    turn_penalty: float
    """λ_turn · turns"""
    repetition_penalty: float
    """λ_rep · repetition"""
    tokens: int
    """episode tokens under cfg.token_measure"""
    turns: int
    repetition: float

    def parts(self) -> dict[str, float]:
        """The logged parts: task, tokens_penalty, turn_penalty, repetition_penalty, tokens."""
        d = asdict(self)
        return {k: float(d[k]) for k in PART_KEYS}


def _check_lambda(lambda_tok: float) -> float:
    return finite_float(lambda_tok, "lambda_tok", RewardError)


def message_tokens(message: Message, measure: str) -> int:
    """One message's tokens under ``measure``; summed over messages this equals ``Episode.tokens``."""
    count = measured_tokens(message, measure)
    if count is None:
        raise RewardError(f"reward.token_measure: unknown {measure!r} (allowed: {', '.join(TOKEN_MEASURES)})")
    return count


def _repetition_inputs(episode: Episode) -> tuple[list[bool], list[list[int]]]:
    return [m.silent for m in episode.messages], [m.completion_ids for m in episode.messages]


def task_reward(episode: Episode) -> float:
    """r_task: 1.0 for a correct (graded) final answer, else 0.0."""
    if episode.grade is None:
        raise RewardError(f"episode {episode.question_id!r}/{episode.group_index} was not graded before the reward")
    return 1.0 if episode.correct else 0.0


def compute_reward(episode: Episode, cfg: RewardConfig, lambda_tok: float) -> RewardBreakdown:
    """Reward of one episode; repetition is recomputed from the token ids (n = cfg.repetition_ngram)."""
    lam = _check_lambda(lambda_tok)
    task = task_reward(episode)
    tokens = episode.tokens(cfg.token_measure)
    turns = episode.turns
    repetition = episode_repetition(*_repetition_inputs(episode), n=cfg.repetition_ngram)
    tokens_penalty = lam * tokens / cfg.token_norm
    turn_penalty = cfg.lambda_turn * turns
    repetition_penalty = cfg.lambda_rep * repetition
    total = task - tokens_penalty - turn_penalty - repetition_penalty
    return RewardBreakdown(total=total, task=task, tokens_penalty=tokens_penalty, turn_penalty=turn_penalty,
                           repetition_penalty=repetition_penalty, tokens=tokens, turns=turns,
                           repetition=repetition)


def apply_rewards(episodes: Iterable[Episode], cfg: RewardConfig, lambda_tok: float) -> None:
    """Set ``episode.reward`` (a :class:`RewardBreakdown`) of every episode in place."""
    for episode in episodes:
        episode.reward = compute_reward(episode, cfg, lambda_tok)


def message_costs(episode: Episode, cfg: RewardConfig, lambda_tok: float) -> list[dict[str, float]]:
    """Each message's share of the episode cost, as ``{tokens_penalty, turn_penalty, repetition_penalty}``.

    tokens: λ_tok · (its tokens under cfg.token_measure) / B_norm; turn: λ_turn if it spoke;
    repetition: λ_rep · (its repetition) / turns -- its contribution to the episode mean, so
    that the shares of each part sum exactly to :func:`compute_reward`'s part.
    """
    lam = _check_lambda(lambda_tok)
    reps = message_repetitions(*_repetition_inputs(episode), n=cfg.repetition_ngram)
    turns = episode.turns
    out = []
    for m, rep in zip(episode.messages, reps, strict=True):
        out.append({
            "tokens_penalty": lam * message_tokens(m, cfg.token_measure) / cfg.token_norm,
            "turn_penalty": 0.0 if m.silent else cfg.lambda_turn,
            "repetition_penalty": 0.0 if m.silent or turns == 0 else cfg.lambda_rep * rep / turns,
        })
    return out


def message_rewards(episode: Episode, cfg: RewardConfig, lambda_tok: float) -> list[float]:
    """Shaped per-message credit: r_task minus the message's own cost (see :func:`message_costs`).

    Used when ``cfg.per_agent_credit``: a verbose agent is charged for its own tokens instead of
    sharing the whole episode's bill with agents that stayed silent.
    """
    task = task_reward(episode)
    return [task - sum(c.values()) for c in message_costs(episode, cfg, lambda_tok)]
