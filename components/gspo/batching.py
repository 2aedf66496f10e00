"""Pack agent messages (GSPO "sequences") into tensors, and split a step's rows into mini-batches;
:func:`components.gspo.logprobs.completion_logprobs` scores them under the policy.

Layout: every row is ``[prompt | completion | right pad]``, left-aligned, ``P + C`` columns wide
(``P`` = longest prompt, ``C`` = longest completion). A causal LM never lets a real token see the
pads that follow it, so the forward needs NO attention mask and positions are plain ``arange``,
exactly as in generation (see decode.py). That matters for speed: a padding mask forces SDPA off
its causal kernel (on CPU ~2x slower attention forward and backward).

Completion token ``t`` of row ``r`` is predicted by the logit at column ``p_r - 1 + t``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from components.mas.records import Message


@dataclass
class SequenceBatch:
    """Padded messages. Shapes: B rows, P + C columns, C completion columns."""

    input_ids: torch.Tensor
    """[B, P+C] long, left-aligned: prompt, completion, then pad"""
    prompt_lens: torch.Tensor
    """[B] long: p_r, the column where row r's completion starts"""
    completion_ids: torch.Tensor
    """[B, C] long (pad where completion_mask is 0)"""
    completion_mask: torch.Tensor
    """[B, C] float"""
    no_silence: torch.Tensor | None = None
    """[B] bool: rows whose first token could not be silence either (``Message.silence_allowed``
    False); None when every row could"""

    def to(self, device: torch.device | str) -> SequenceBatch:
        ns = None if self.no_silence is None else self.no_silence.to(device)
        return SequenceBatch(*(t.to(device) for t in (self.input_ids, self.prompt_lens, self.completion_ids,
                                                       self.completion_mask)), ns)

    def select(self, idx: torch.Tensor) -> SequenceBatch:
        """Rows ``idx``, trimmed to their own ``max p_r + C`` columns (small mini-batches stay cheap)."""
        idx = idx.to(self.input_ids.device)
        lens = self.prompt_lens[idx]
        width = int(lens.max()) + self.completion_ids.shape[1]
        ns = None if self.no_silence is None else self.no_silence[idx]
        return SequenceBatch(self.input_ids[idx, :width], lens, self.completion_ids[idx], self.completion_mask[idx], ns)


def pack_messages(messages: Sequence[Message], pad_id: int) -> SequenceBatch:
    """Pack ``messages`` left-aligned (prompt, completion, pad) into one :class:`SequenceBatch`."""
    if not messages:
        raise ValueError("pack_messages needs at least one message")
    p = max(len(m.prompt_ids) for m in messages)
    c = max(1, max(len(m.completion_ids) for m in messages))
    b = len(messages)
    input_ids = torch.full((b, p + c), pad_id, dtype=torch.long)
    completion_ids = torch.full((b, c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((b, c), dtype=torch.float32)
    for i, m in enumerate(messages):
        if not m.prompt_ids:
            raise ValueError(f"message {i} (agent {m.agent_id}, round {m.round}) has an empty prompt")
        lp, lc = len(m.prompt_ids), len(m.completion_ids)
        input_ids[i, :lp] = torch.tensor(m.prompt_ids, dtype=torch.long)
        if lc:
            input_ids[i, lp:lp + lc] = torch.tensor(m.completion_ids, dtype=torch.long)
            completion_ids[i, :lc] = input_ids[i, lp:lp + lc]
            completion_mask[i, :lc] = 1.0
    lens = torch.tensor([len(m.prompt_ids) for m in messages], dtype=torch.long)
    no_silence = torch.tensor([not m.silence_allowed for m in messages], dtype=torch.bool)
    return SequenceBatch(input_ids, lens, completion_ids, completion_mask,
                         no_silence if bool(no_silence.any()) else None)


def minibatch_indices(n: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffle ``range(n)`` and split into ``minibatches`` near-equal parts (never an empty one)."""
    perm = torch.randperm(n, generator=generator)
    parts = max(1, min(minibatches, n))
    return [chunk for chunk in torch.tensor_split(perm, parts) if chunk.numel()]
