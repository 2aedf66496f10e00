"""Pack agent messages (GSPO "sequences") into tensors and score them under the policy.

Layout: every row is ``[left pad | prompt | completion | right pad]`` with prompts left-padded
to ``P`` and completions right-padded to ``C``, so all completions start at column ``P``. The
policy's log-probs for the completion then come from the last ``C + 1`` logits only
(``logits_to_keep``), never a ``B x (P+C) x V`` tensor.

Position ids are derived from the attention mask, exactly as generation does with left
padding, so recomputed log-probs match the behaviour log-probs of the rollout engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from components.mas.records import Message


@dataclass
class SequenceBatch:
    """Padded messages. Shapes: B rows, P prompt columns, C completion columns."""

    input_ids: torch.Tensor
    """[B, P+C] long"""
    attention_mask: torch.Tensor
    """[B, P+C] long (1 = real token)"""
    position_ids: torch.Tensor
    """[B, P+C] long"""
    completion_ids: torch.Tensor
    """[B, C] long (pad where completion_mask is 0)"""
    completion_mask: torch.Tensor
    """[B, C] float"""
    behaviour_logp: torch.Tensor
    """[B, C] float, log-probs recorded by the rollout engine"""

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.completion_ids.shape[1]

    def to(self, device: torch.device | str) -> SequenceBatch:
        return SequenceBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids,
                                                       self.completion_ids, self.completion_mask,
                                                       self.behaviour_logp)))


def pack_messages(messages: Sequence[Message], pad_id: int) -> SequenceBatch:
    """Left-pad prompts and right-pad completions of ``messages`` into one :class:`SequenceBatch`."""
    if not messages:
        raise ValueError("pack_messages needs at least one message")
    p = max(len(m.prompt_ids) for m in messages)
    c = max(1, max(len(m.completion_ids) for m in messages))
    b = len(messages)
    input_ids = torch.full((b, p + c), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p + c), dtype=torch.long)
    completion_ids = torch.full((b, c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((b, c), dtype=torch.float32)
    behaviour = torch.zeros((b, c), dtype=torch.float32)
    for i, m in enumerate(messages):
        lp, lc = len(m.prompt_ids), len(m.completion_ids)
        input_ids[i, p - lp:p] = torch.tensor(m.prompt_ids, dtype=torch.long)
        attention[i, p - lp:p] = 1
        if lc:
            input_ids[i, p:p + lc] = torch.tensor(m.completion_ids, dtype=torch.long)
            attention[i, p:p + lc] = 1
            completion_ids[i, :lc] = input_ids[i, p:p + lc]
            completion_mask[i, :lc] = 1.0
            behaviour[i, :lc] = torch.tensor(m.logprobs[:lc], dtype=torch.float32)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return SequenceBatch(input_ids, attention, position_ids, completion_ids, completion_mask, behaviour)


def completion_logprobs(model: torch.nn.Module, batch: SequenceBatch, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs of each row's completion under ``model``: ``[B, C]`` (0 under padding).

    ``temperature`` divides the logits as the sampler did, so π_old equals the behaviour policy
    that generated the messages (the rollout engine records log-probs at the same temperature).

    Only the last ``C + 1`` positions are projected to the vocabulary; the logit at column
    ``P - 1 + t`` predicts completion token ``t``.
    """
    from components.gspo.loss import token_logprobs

    c = batch.completion_ids.shape[1]
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, logits_to_keep=c + 1, use_cache=False)
    logits = out.logits[:, :-1, :]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = token_logprobs(logits, batch.completion_ids)
    return logp * batch.completion_mask


def minibatch_indices(n: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffle ``range(n)`` and split into ``minibatches`` near-equal parts (never an empty one)."""
    perm = torch.randperm(n, generator=generator)
    parts = max(1, min(minibatches, n))
    return [chunk for chunk in torch.tensor_split(perm, parts) if chunk.numel()]
