"""Batched sampling loop over a KV cache: one call generates every agent turn of a round (or wave).

Why a hand-written loop rather than ``model.generate``: we need, per row, the sampled ids up to and
including EOS, without padding, and the behaviour log-prob of each id, in the same pass. ``generate``
returns processed scores for every row at every step (a (B, V) tensor per step kept until the end)
plus per-call set-up of logits processors, stopping criteria and cache classes; on CPU with small
models that fixed overhead dominates. The loop below is ~40 lines: left-padded prefill with explicit
position ids, then one (B, 1) forward per step on a ``DynamicCache``; its cost grows with the longest
message, never with the number of rows. Batched and one-row greedy decoding give identical ids
(tested), which is the left-padding correctness check.

Log-probs stored: ``log_softmax(logits / T)`` of the sampled id, i.e. the sampling distribution at
temperature T *before* top-p truncation (T = 1 when greedy). That is what a trainer can recompute
from the model alone with the same temperature; the GSPO trainer recomputes old log-probs once per
rollout batch anyway, so these are for diagnostics and off-policy checks. A caller's
``logits_processor`` (e.g. a bias) is applied first and is part of the sampling distribution.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

LogitsProcessor = Callable[[torch.Tensor, int], torch.Tensor]
"""(logits (B, V) float32, step) -> logits (B, V)"""


@dataclass
class Generation:
    """Per-row outputs of one batched call."""

    ids: list[list[int]]
    """completion ids per row, EOS included when generated, no padding"""
    logprobs: list[list[float]]
    """log-prob of each id under the sampling distribution (same lengths as ids)"""
    steps: int
    """forward passes after the prefill (= length of the longest completion)"""


def cache_kwarg(model) -> str:
    """transformers 5.x names the cache argument ``cache``; 4.x ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the nucleus (the top token is always kept). probs: (B, V)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


def _new_cache(model, batch: int, max_len: int, static: bool):
    from transformers import DynamicCache
    if static:
        from transformers import StaticCache
        return StaticCache(config=model.config, max_cache_len=max_len)
    return DynamicCache(config=model.config)


def _is_stop_reply(toks: torch.Tensor, lengths: torch.Tensor, replies: list[list[int]]) -> torch.Tensor:
    """[B] bool: the row's completion so far is exactly one of ``replies`` (only checked while
    completions are no longer than the longest reply, so it costs a few early steps)."""
    hit = torch.zeros(toks.shape[0], dtype=torch.bool, device=toks.device)
    for reply in replies:
        n = len(reply)
        if n == toks.shape[1]:
            ref = torch.tensor(reply, dtype=toks.dtype, device=toks.device)
            hit |= (toks == ref).all(-1) & (lengths == n)
    return hit


@torch.no_grad()
def generate_batch(model, prompts: list[list[int]], *, max_new_tokens: int, eos_id: int, pad_id: int,
                   temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
                   generator: torch.Generator | None = None, min_new_tokens: int = 0,
                   logits_processor: LogitsProcessor | None = None, device: str | torch.device = "cpu",
                   static_cache: bool = False, step_fn: Callable | None = None,
                   stop_replies: list[list[int]] | None = None) -> Generation:
    """Sample completions for every prompt in one batched decode.

    prompts: B id lists (any lengths, left-padded here). Rows stop at ``eos_id`` or after
    ``max_new_tokens``; EOS is masked for the first ``min_new_tokens`` steps (benchmarks use this
    for fixed-length messages). ``static_cache`` (CUDA only, checked by the caller) swaps the
    DynamicCache for a StaticCache so that a compiled ``step_fn`` sees fixed shapes.
    ``stop_replies``: complete replies (the silence marker's id variants): a row whose whole
    completion so far equals one of them stops there, so silence costs only the marker's tokens.
    """
    b = len(prompts)
    if b == 0:
        return Generation([], [], 0)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        input_ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p):] = 1
    input_ids = input_ids.to(device)
    # one mask buffer for prompt + every new token: the dynamic path passes growing views of it
    # (no per-step torch.cat), the static path the whole buffer (fixed shapes for the compiled step)
    full_mask = torch.cat([mask, torch.zeros((b, max_new_tokens), dtype=torch.long)], 1).to(device)
    mask = full_mask if static_cache else full_mask[:, :width]
    positions = (full_mask[:, :width].cumsum(-1) - 1).clamp(min=0)
    cache = _new_cache(model, b, width + max_new_tokens, static_cache)
    kw = cache_kwarg(model)
    forward = step_fn or model
    out = model(input_ids=input_ids, attention_mask=mask,
                position_ids=positions, use_cache=True, logits_to_keep=1, **{kw: cache})
    last_pos = positions[:, -1]
    temp = 1.0 if greedy or temperature <= 0 else float(temperature)
    toks = torch.full((b, max_new_tokens), pad_id, dtype=torch.long, device=device)
    lps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    lengths = torch.zeros(b, dtype=torch.long, device=device)
    steps = 0
    for t in range(max_new_tokens):
        logits = out.logits[:, -1, :].float()
        if logits_processor is not None:
            logits = logits_processor(logits, t)
        if t < min_new_tokens:
            logits[:, eos_id] = float("-inf")
        logp_all = torch.log_softmax(logits / temp, dim=-1)
        if greedy or temperature <= 0:
            nxt = logits.argmax(-1)
        else:
            probs = logp_all.exp()
            if top_p < 1.0:
                probs = _top_p_filter(probs, top_p)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        toks[:, t] = nxt
        lps[:, t] = logp_all.gather(-1, nxt[:, None]).squeeze(-1)
        lengths += (~done).long()
        done = done | (nxt == eos_id)
        if stop_replies and t < max(len(v) for v in stop_replies):
            done = done | _is_stop_reply(toks[:, : t + 1], lengths, stop_replies)
        steps = t + 1
        if t == max_new_tokens - 1 or bool(done.all()):
            break
        last_pos = last_pos + 1
        full_mask[:, width + t] = 1
        if not static_cache:
            mask = full_mask[:, : width + t + 1]
        out = forward(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                      use_cache=True, **{kw: cache})
    toks_l, lps_l, lens = toks.cpu().tolist(), lps.cpu().tolist(), lengths.cpu().tolist()
    return Generation([toks_l[r][:lens[r]] for r in range(b)], [lps_l[r][:lens[r]] for r in range(b)], steps)
