"""Prompt prefill for the batched decoder (:func:`components.mas.decode.generate_batch`).

Three savings, all exact (a causal LM's key/value states for a prefix do not depend on what
follows it):

* **Right-padded, mask-free prefill.** Every prompt except its last id is prefilled
  left-aligned; a real token never attends to the pads after it, so no padding mask is passed
  and SDPA keeps its causal kernel (a left-padded prefill needs a 4-D mask, which on CPU falls
  back to the math kernel at ~2x the cost). The pads' cache slots are masked out afterwards.
* **Shared prompts prefilled once.** The G episodes of a question give G identical first-round
  prompts per agent: one row is prefilled and its cache rows repeated.
* **Prefix reuse across rounds** (:class:`PrefixStore`). An agent's prompt in every round starts
  with the same frame prefix (system prompt + task, see context.py), most of its tokens. The first
  call stores each prefix's key/value states; later calls of the same rollout (same weights) seed
  the cache with them and prefill only the rest, under an explicit padding mask and positions.

Column layout of the returned mask, per row r (``q_r`` = reused prefix length, ``n_r`` = prompt
length): ``[0, q_r)`` prefix | pad to ``P`` | ``[P, P + n_r - 1 - q_r)`` rest of the prompt | pad to
``P + R`` | column ``P + R``: the last prompt id (fed by the caller as the first one-token step) |
``max_new_tokens`` columns for generated ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

PrefixKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each [H_kv, q, D]."""


@dataclass
class PrefixStore:
    """Key/value states of prompt prefixes for ONE rollout (the weights must not change in between)."""

    entries: dict[tuple[int, ...], PrefixKV] = field(default_factory=dict)
    reused_tokens: int = 0
    """prompt tokens not prefilled thanks to a stored prefix (diagnostics)"""


@dataclass
class Prefill:
    cache: Any
    mask: torch.Tensor
    """[B, last_col + 1 + max_new_tokens] long attention mask (see module docstring)"""
    last_col: int
    """column of the last prompt id: the caller's first one-token step"""


def _new_cache(model: Any, max_len: int, static: bool) -> Any:
    from transformers import DynamicCache
    if static:
        from transformers import StaticCache
        return StaticCache(config=model.config, max_cache_len=max_len)
    return DynamicCache(config=model.config)


def _reusable(prompts: list[list[int]], prefix_lens: list[int] | None, store: PrefixStore | None) -> list[int]:
    """Per row, the stored prefix length to reuse; all zeros unless EVERY row with a prefix has it
    stored (mixing seeded and fresh rows would buy little and complicate the layout)."""
    zeros = [0] * len(prompts)
    if store is None or prefix_lens is None:
        return zeros
    q = [n if 0 < n < len(p) else 0 for p, n in zip(prompts, prefix_lens, strict=True)]
    if not any(q) or any(n and tuple(p[:n]) not in store.entries for p, n in zip(prompts, q, strict=True)):
        return zeros
    return q


@torch.no_grad()
def prefill(model: Any, prompts: list[list[int]], *, pad_id: int, max_new_tokens: int, device: Any,
            static_cache: bool, cache_kw: str, prefix_lens: list[int] | None = None,
            store: PrefixStore | None = None) -> Prefill:
    """Fill a KV cache with ``prompts[r][:-1]`` for every row; see the module docstring.

    ``prefix_lens[r]``: length of row r's reusable prefix (0 = none). With a ``store``, prefixes
    already stored are reused, and a fresh prefill stores the prefixes it computed.
    """
    b = len(prompts)
    static = static_cache
    q = [0] * b if static else _reusable(prompts, prefix_lens, store)
    slot: dict[tuple[int, ...], int] = {}
    inverse = [slot.setdefault(tuple(p), len(slot)) for p in prompts]
    dedup = not static and len(slot) < b
    first_row = {u: r for r, u in reversed(list(enumerate(inverse)))}
    rows = [first_row[u] for u in range(len(slot))] if dedup else list(range(b))
    p_cols = max(q)
    r_cols = max(len(p) - 1 - n for p, n in zip(prompts, q, strict=True))
    last_col = p_cols + r_cols
    mask = torch.zeros((b, last_col + 1 + max_new_tokens), dtype=torch.long)
    for r, (p, n) in enumerate(zip(prompts, q, strict=True)):
        mask[r, :n] = 1
        mask[r, p_cols: p_cols + len(p) - 1 - n] = 1
    mask[:, last_col] = 1
    mask = mask.to(device)
    cache = _new_cache(model, last_col + 1 + max_new_tokens, static)
    if p_cols:  # seed the cache with the stored prefixes, right-padded to p_cols
        assert store is not None
        kvs = [store.entries[tuple(prompts[r][: q[r]])] for r in rows]
        for layer, (k0, v0) in enumerate(kvs[0]):
            keys = k0.new_zeros((len(rows), k0.shape[0], p_cols, k0.shape[-1]))
            values = v0.new_zeros((len(rows), v0.shape[0], p_cols, v0.shape[-1]))
            for i, kv in enumerate(kvs):
                keys[i, :, : kv[layer][0].shape[1]] = kv[layer][0]
                values[i, :, : kv[layer][1].shape[1]] = kv[layer][1]
            cache.update(keys, values, layer)
        store.reused_tokens += sum(q)
    if r_cols:
        ids = torch.full((len(rows), r_cols), pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            rest = prompts[r][q[r]: -1]
            ids[i, : len(rest)] = torch.tensor(rest, dtype=torch.long)
        kwargs: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1, cache_kw: cache}
        if static:  # a static cache always takes the whole mask buffer (fixed shapes for compile)
            kwargs["attention_mask"] = mask
        elif p_cols:  # holes between each prefix and the rest: explicit mask and positions
            sel = torch.tensor(rows, device=mask.device)
            kwargs["attention_mask"] = mask[sel, : p_cols + r_cols]
            kwargs["position_ids"] = (torch.tensor([q[r] for r in rows])[:, None]
                                      + torch.arange(r_cols)[None, :]).to(device)
        model(input_ids=ids.to(device), **kwargs)
        if store is not None and not p_cols and not static and prefix_lens is not None:
            _store_prefixes(cache, store, [prompts[r] for r in rows], [prefix_lens[r] for r in rows])
    if dedup:
        cache.batch_select_indices(torch.tensor(inverse, device=device))
    return Prefill(cache, mask, last_col)


def _store_prefixes(cache: Any, store: PrefixStore, prompts: list[list[int]], prefix_lens: list[int]) -> None:
    """Copy each row's prefix states ([0, n) of a fresh, left-aligned prefill) into ``store``."""
    for i, (p, n) in enumerate(zip(prompts, prefix_lens, strict=True)):
        key = tuple(p[:n])
        if 0 < n < len(p) and key not in store.entries:
            store.entries[key] = [(layer.keys[i, :, :n].clone(), layer.values[i, :, :n].clone())
                                  for layer in cache.layers]
