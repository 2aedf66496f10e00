"""Pack agent messages (GSPO "sequences") into tensors and score them under the policy.

Layout: every row is ``[prompt | completion | right pad]``, left-aligned, ``P + C`` columns wide
(``P`` = longest prompt, ``C`` = longest completion). A causal LM never lets a real token see the
pads that follow it, so the forward needs NO attention mask and positions are plain ``arange``,
exactly as in generation (see decode.py). That matters for speed: a padding mask forces SDPA off
its causal kernel (on CPU ~2x slower attention forward and backward).

Completion token ``t`` of row ``r`` is predicted by the logit at column ``p_r - 1 + t``. Only the
columns from ``min_r p_r - 1`` on are projected to the vocabulary (``logits_to_keep``), never a
``B x (P+C) x V`` tensor unless prompts differ by ~P tokens.
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


def completion_logprobs(model: torch.nn.Module, batch: SequenceBatch, temperature: float = 1.0,
                        silence_id: int | None = None, silence_from: int = 1,
                        first_banned: torch.Tensor | None = None, share_prompts: bool = False) -> torch.Tensor:
    """Per-token log-probs of each row's completion under ``model``: ``[B, C]`` float32 (0 under padding).

    ``temperature`` divides the logits as the sampler did, so π_old equals the behaviour policy
    that generated the messages (the rollout engine records log-probs at the same temperature).
    The logits are cast to float32 BEFORE the division and the log-softmax (bf16 models included):
    a bf16 division or log-sum-exp adds noise of the order of the GSPO clip range.
    ``silence_id``: the silence token may only start a reply (the decoder masks it later on), so at
    completion positions t >= 1 the distribution is renormalised without it:
    log p(y) - log(1 - p(silence)), the log-prob under the masked softmax the sampler used.
    ``silence_from`` is the first masked position: 1 for a team, 0 for a lone agent (the decoder
    never lets a lone agent be silent). The first token of a row in ``batch.no_silence`` is
    renormalised without every id of ``first_banned`` ([V] bool, the decoder's mask for those rows;
    required with them): log p(y) - log(1 - p(banned)), a log-sum-exp over those positions only.

    ``share_prompts``: prompt heads common to several rows run once and only the N scored positions
    are projected to the vocabulary (:mod:`components.gspo.shared_prompts`; same values and
    gradients up to rounding), unless the model checkpoints gradients or sharing would save too
    little. Otherwise the plain forward: the
    last ``K = W - min_r p_r + 1`` logits are kept (W = batch width); window column
    ``p_r - 1 + t - (W - K)`` predicts row r's completion token t. Only the N valid completion
    positions are scored (:func:`components.gspo.loss.logprobs_at`, chunked over all rows at once),
    with the sampled id and the silence token sharing one log-sum-exp.
    """
    from components.gspo.loss import logprobs_at
    from components.gspo.shared_prompts import can_share, shared_head_logits

    b, width = batch.input_ids.shape
    c = batch.completion_ids.shape[1]
    rows, t = (batch.completion_mask > 0).nonzero(as_tuple=True)  # [N] each
    shared = (shared_head_logits(model, batch.input_ids, batch.prompt_lens, rows, t)
              if share_prompts and can_share(model) else None)
    if shared is None:
        keep = width - int(batch.prompt_lens.min()) + 1
        logits = model(input_ids=batch.input_ids, logits_to_keep=keep, use_cache=False).logits  # [B, K, V]
        at_b, at_t = rows, batch.prompt_lens[rows] - 1 + t - (width - keep)  # [N] window positions
    else:
        logits = shared[None]  # [1, N, V]: position n predicts completion id t[n] of row rows[n]
        at_b, at_t = torch.zeros_like(rows), torch.arange(rows.shape[0], device=rows.device)
    temp = float(temperature) if temperature > 0 else 1.0
    labels = batch.completion_ids[rows, t][:, None]  # [N, 1]
    if silence_id is not None:
        labels = torch.cat([labels, torch.full_like(labels, silence_id)], dim=1)  # [N, 2]
    lp = logprobs_at(logits, at_b, at_t, labels, temperature=temp)  # [N, K]
    logp = lp[:, 0]
    if silence_id is not None:  # renormalise without the silence token where the decoder masked it
        masked, first = t >= silence_from, None
        if batch.no_silence is not None:
            if first_banned is None:
                raise ValueError("completion_logprobs: rows that had to speak (batch.no_silence) need "
                                 "first_banned, the decoder's mask for their first token")
            first = batch.no_silence[rows] & (t == 0)  # [N]: renormalised below, over the whole banned set
            masked = masked & ~first
        logp = logp - torch.where(masked, torch.log1p(-lp[:, 1].clamp(max=-1e-6).exp()), 0.0)
        if first_banned is not None and first is not None and bool(first.any()):
            k = first.nonzero(as_tuple=True)[0]  # [n0] positions: first tokens of rows that had to speak
            z = logits[at_b[k], at_t[k]].float() / temp  # [n0, V]
            banned = first_banned.to(z.device)[: z.shape[-1]]
            p_banned = (torch.logsumexp(z[:, banned], -1) - torch.logsumexp(z, -1)).exp()  # [n0]
            logp = logp.index_put((k,), logp[k] - torch.log1p(-p_banned.clamp(max=1 - 1e-6)))
    return torch.zeros((b, c), dtype=logp.dtype, device=logp.device).index_put((rows, t), logp)


def minibatch_indices(n: int, minibatches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffle ``range(n)`` and split into ``minibatches`` near-equal parts (never an empty one)."""
    perm = torch.randperm(n, generator=generator)
    parts = max(1, min(minibatches, n))
    return [chunk for chunk in torch.tensor_split(perm, parts) if chunk.numel()]
