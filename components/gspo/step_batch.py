"""One GSPO step's batch: this rank's messages packed for the loss, their advantages, and the step's
statistics over ALL ranks, from one all-gather.

Every rank sends one payload: a row per message ``(question, agent, round, credit, silent)`` and a
row per episode (its metric values). From the gathered rows every rank computes the same group
statistics (a group split across ranks is normalised over all its members), keeps its own
messages' advantages, and the same all-rank means for the logged metrics and the dual controller.
With ``reward.per_agent_credit`` a message's credit is its own shaped reward, else its episode's.

Shapes: M local messages -> ``sequences`` (:class:`SequenceBatch`, B = M rows) and ``advantages`` [M].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from components.config import Config
from components.gspo.advantages import group_advantages, make_group_ids
from components.gspo.batching import SequenceBatch, pack_messages
from components.gspo.policy_engine import Ranks
from components.mas.records import Episode, Message
from components.mas.roles import DECIDER
from components.reward.reward import message_rewards

EPISODE_METRICS = ("reward", "accuracy", "tokens_total", "tokens_completion", "tokens_communicated", "turns",
                   "repetition", "silence_rate", "silence_prob", "calls_skipped")
"""``train/<name>`` means over episodes; ``budget_tokens`` (the controller's measure) is added"""


class MessageRow(NamedTuple):
    """What every rank sends about one message (plain data: it crosses the all-gather)."""

    question: str
    agent: int
    round: int
    credit: float
    """the message's reward before normalisation (its episode's, or its own shaped credit)"""
    silent: bool
    capped: bool
    """the reply was cut by mas.max_message_tokens (Message.truncated)"""
    private: bool
    """its agent held the private fact (split-information items)"""
    split_info: bool
    """its episode is a split-information episode"""
    decider: bool
    """the decision agent's turn (``mas.aggregation: decision_agent``), not a turn of a team agent"""


def episode_row(ep: Episode, token_measure: str) -> dict[str, float]:
    """One episode's metric values (the reward must have been applied)."""
    assert ep.reward is not None, "apply the reward before building the step batch"
    n = max(1, len(ep.messages))
    return {"reward": ep.reward.total, "accuracy": float(ep.correct), "tokens_total": float(ep.total_tokens),
            "tokens_completion": float(ep.completion_tokens), "tokens_communicated": float(ep.communicated_tokens),
            "turns": float(ep.turns), "repetition": ep.reward.repetition, "silence_rate": ep.silence_rate,
            "silence_prob": sum(m.silence_prob for m in ep.messages) / n, "calls_skipped": float(ep.calls_skipped),
            "budget_tokens": float(ep.tokens(token_measure))}


@dataclass
class StepBatch:
    """This rank's part of a step (see the module docstring)."""

    messages: list[Message]
    sequences: SequenceBatch
    advantages: torch.Tensor
    """[M] float32, on the sequences' device"""
    metrics: dict[str, float]
    """all-rank means under the contract names, plus ``silence/agent<a>_round<r>`` (team agents),
    ``silence/decider`` (with a decision agent) and advantage counts"""
    mean_tokens: float
    """all-rank mean tokens per episode under ``reward.token_measure`` (what the dual controller tracks)"""

    @classmethod
    def build(cls, episodes: Sequence[Episode], cfg: Config, dist: Ranks, lambda_tok: float, pad_id: int,
              device: torch.device | str) -> StepBatch:
        messages: list[Message] = []
        msg_rows: list[MessageRow] = []
        for ep in episodes:
            assert ep.reward is not None, "apply the reward before building the step batch"
            credits = (message_rewards(ep, cfg.reward, lambda_tok) if cfg.reward.per_agent_credit
                       else [ep.reward.total] * len(ep.messages))
            for m, credit in zip(ep.messages, credits, strict=True):
                messages.append(m)
                msg_rows.append(MessageRow(ep.question_id, m.agent_id, m.round, float(credit), m.silent,
                                           m.truncated, m.private, ep_has_fact(ep), m.role == DECIDER))
        ep_rows = [episode_row(ep, cfg.reward.token_measure) for ep in episodes]
        gathered = dist.all_gather((msg_rows, ep_rows))
        all_msgs = [r for part, _ in gathered for r in part]
        all_eps = [r for _, part in gathered for r in part]
        offset = sum(len(part) for part, _ in gathered[: dist.rank])

        keys: list[Sequence[Any]] = [[r.question for r in all_msgs]]
        if cfg.gspo.group_by_agent_round:
            keys += [[r.agent for r in all_msgs], [r.round for r in all_msgs]]
        adv = group_advantages(torch.tensor([r.credit for r in all_msgs], dtype=torch.float32), make_group_ids(*keys),
                               mode=cfg.gspo.adv_norm, std_floor=cfg.gspo.adv_std_floor)
        mine = adv.advantages[offset: offset + len(msg_rows)].to(device)
        metrics = {f"train/{k}": _mean([r[k] for r in all_eps]) for k in (*EPISODE_METRICS, "budget_tokens")}
        metrics |= {"train/zero_adv_groups": float(adv.zero_spread_groups), "train/adv_groups": float(adv.n_groups),
                    "train/episodes": float(len(all_eps)), "train/messages": float(len(all_msgs))}
        metrics |= silence_by_agent_round((r.agent, r.round, r.silent) for r in all_msgs if not r.decider)
        deciders = [float(r.silent) for r in all_msgs if r.decider]
        if deciders:  # its own key: as `silence/agent<N>_round<R>` it read as a team agent N
            metrics["silence/decider"] = _mean(deciders)
        metrics["train/cap_hit_rate"] = _mean([float(r.capped) for r in all_msgs])
        split = [r for r in all_msgs if r.split_info]  # split-information episodes: silence by role
        if split:
            metrics["silence/informed"] = _mean([float(r.silent) for r in split if r.private])
            metrics["silence/uninformed"] = _mean([float(r.silent) for r in split if not r.private])
        return cls(messages, pack_messages(messages, pad_id).to(device), mine, metrics,
                   metrics["train/budget_tokens"])


def ep_has_fact(ep: Episode) -> bool:
    """A split-information episode: one of its agents held a private fact."""
    return any(m.private for m in ep.messages)


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def silence_by_agent_round(rows: Iterable[tuple[int, int, bool]]) -> dict[str, float]:
    """``silence/agent{a}_round{r}`` rates from ``(agent, round, silent)`` rows."""
    counts: dict[tuple[int, int], list[int]] = {}
    for agent, rnd, silent in rows:
        c = counts.setdefault((agent, rnd), [0, 0])
        c[0] += int(silent)
        c[1] += 1
    return {f"silence/agent{a}_round{r}": s / max(1, t) for (a, r), (s, t) in sorted(counts.items())}
