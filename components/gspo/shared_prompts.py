"""Score a batch of messages with each shared prompt head computed once, gradients included.

Why: a GSPO step's messages share most of their prompt ids. The G episodes of a question give G
identical first-round prompts per agent, and every later prompt of an agent starts with the same
frame (system prompt + task). The plain packed forward (:func:`components.gspo.batching.
completion_logprobs`) runs every row's whole prompt through the model; on the split-information
proof ~48 rows of ~175 prompt ids carry ~15 completion ids each, so ~90 % of the update's compute
re-reads prompts. The rollout already prefills shared heads once (components/mas/prefill.py);
this module does the same for the training forwards (π_θ with gradients, π_old, π_ref).

How (exact in real arithmetic; a causal LM's key/values for a head do not depend on what follows):

1. :func:`components.mas.prefill.shared_heads` finds, per row r, the longest head ``q_r`` it shares
   with another row (≥ 16 ids, always short of the whole prompt) and the distinct maximal heads.
2. The heads run once, right-padded and mask-free, WITH gradients: their key/values
   ``[n_heads, H_kv, L, D]`` per layer are indexed out to ``[B, H_kv, L, D]`` (``index_select``,
   so the backward sums every row's gradient into its head: the same gradient as B separate
   forwards of the head).
3. Each row's rest (``prompt[q_r:]`` + its completion, right-padded) runs on that cache with an
   explicit padding mask (columns ``[q_r, L)`` of row r hold another head's ids or pads) and
   positions ``q_r + arange(S)``. Rows whose rest is one id (repeated first-round prompts) and rows
   with a transcript differ ~100-fold in rest length, so the rows are split in two calls where that
   saves padded columns (:func:`_buckets`).
4. The vocabulary projection runs on the N positions that predict a completion id only (the
   decoder's last hidden states gathered, then the output embedding), not on ``B x S`` columns:
   with V = 49 152 the projection of every column costs a quarter of the forward.

Libraries: TRL, verl and OpenRLHF score every row's full sequence in training (verl and SGLang
share prefixes at generation only), so there is nothing to call; hence this module.

Not with gradient checkpointing: transformers drops ``use_cache`` in a checkpointed training
forward, so the heads' key/values would not reach the rows; nor for models that post-process
their logits (``final_logit_softcapping``, ``logit_scale``), which step 4 would skip. The caller
falls back to the plain forward there (and wherever sharing saves fewer than
:data:`MIN_SAVED_IDS` ids).
"""

from __future__ import annotations

import torch
from torch import nn

from components.mas.decode import cache_kwarg
from components.mas.prefill import new_cache, shared_heads

MIN_SAVED_IDS = 64
"""prompt ids the heads must save before sharing pays for its second forward call"""

MIN_SAVED_COLUMNS = 32
"""padded suffix columns (rows x width) a second suffix call must save (a call's own overhead is
milliseconds; a column of SmolLM2-135M costs ~0.3 GFLOP)"""


def can_share(model: nn.Module) -> bool:
    """False under gradient checkpointing and for logits the model post-processes (see the module
    docstring). transformers 5.24 renamed the checkpointing flag (the old name warns); a GPU host's
    older 5.x has only the old one."""
    config = getattr(model, "config", None)
    if any(getattr(config, k, None) is not None for k in ("final_logit_softcapping", "logit_scale")):
        return False
    flag = getattr(model, "is_activation_checkpointing", None)
    return not bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def _buckets(rest: list[int], completion_len: int) -> list[list[int]]:
    """Rows in one suffix call, or two split at the rest length that saves the most padded columns."""
    order = sorted(range(len(rest)), key=rest.__getitem__)
    width = [rest[i] + completion_len for i in order]
    whole = len(order) * width[-1]
    best, cut = MIN_SAVED_COLUMNS, 0
    for k in range(1, len(order)):
        saved = whole - (k * width[k - 1] + (len(order) - k) * width[-1])
        if saved > best:
            best, cut = saved, k
    return [order[:cut], order[cut:]] if cut else [order]


def shared_head_logits(model: nn.Module, input_ids: torch.Tensor, prompt_lens: torch.Tensor, rows: torch.Tensor,
                       t: torch.Tensor) -> torch.Tensor | None:
    """The logits that predict completion id ``t[n]`` of row ``rows[n]``, shared heads computed once.

    ``input_ids`` [B, P+C] left-aligned ``prompt | completion | pad`` with ``prompt_lens`` [B] = p_r;
    ``rows``, ``t`` [N] long. Returns [N, V] logits in the model's dtype, or None when the heads
    would save fewer than :data:`MIN_SAVED_IDS` ids (the caller then runs the plain forward).
    """
    lens = [int(n) for n in prompt_lens.tolist()]
    q, heads, donor = shared_heads([input_ids[r, :n].tolist() for r, n in enumerate(lens)])
    if sum(q) - sum(map(len, heads)) < MIN_SAVED_IDS:
        return None
    device, decoder = input_ids.device, model.get_decoder()
    kw, c, h = cache_kwarg(decoder), input_ids.shape[1] - max(lens), max(map(len, heads))
    head_ids = torch.zeros((len(heads), h), dtype=torch.long)
    for i, head in enumerate(heads):
        head_ids[i, : len(head)] = torch.tensor(head, dtype=torch.long)
    head_cache = new_cache(model)
    decoder(input_ids=head_ids.to(device), use_cache=True, **{kw: head_cache})
    rest = [n - k for n, k in zip(lens, q, strict=True)]  # prompt ids each row still runs (>= 1)
    hidden, order = [], []
    for bucket in _buckets(rest, c):
        sel = torch.tensor(bucket, device=device)
        pick = torch.tensor([max(donor[r], 0) for r in bucket], device=device)  # no head: all masked
        cache = new_cache(model)
        for i, layer in enumerate(head_cache.layers):
            cache.update(layer.keys.index_select(0, pick), layer.values.index_select(0, pick), i)
        s = max(rest[r] for r in bucket) + c
        ids = torch.zeros((len(bucket), s), dtype=torch.long, device=device)
        mask = torch.ones((len(bucket), h + s), dtype=torch.long, device=device)  # pads after a row's ids: causal
        for j, r in enumerate(bucket):
            tail = input_ids[r, q[r]: lens[r] + c]  # rest of the prompt, the completion and its pads
            ids[j, : tail.shape[0]] = tail
            mask[j, q[r]: h] = 0
        positions = torch.tensor([q[r] for r in bucket], device=device)[:, None] + torch.arange(s, device=device)
        out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{kw: cache})
        local = torch.full((len(lens),), -1, dtype=torch.long, device=device)
        local[sel] = torch.arange(len(bucket), device=device)
        n = (local[rows] >= 0).nonzero(as_tuple=True)[0]  # [n_k] this bucket's positions
        r_n = rows[n]
        cols = torch.tensor(rest, device=device)[r_n] - 1 + t[n]
        hidden.append(out.last_hidden_state[local[r_n], cols])  # [n_k, d]
        order.append(n)
    gathered = torch.cat(hidden)[torch.argsort(torch.cat(order))]  # [N, d], back in (rows, t) order
    return model.get_output_embeddings()(gathered)
