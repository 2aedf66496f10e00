"""Prompt prefill for the batched decoder (:func:`components.mas.decode.generate_batch`).

Four savings, all exact (a causal LM's key/value states for a prefix do not depend on what
follows it):

* **Right-padded, mask-free prefill.** Every prompt except its last id is prefilled
  left-aligned; a real token never attends to the pads after it, so no padding mask is passed
  and SDPA keeps its causal kernel (a left-padded prefill needs a 4-D mask, which on CPU falls
  back to the math kernel at ~2x the cost). The pads' cache slots are masked out afterwards.
* **Shared prompts prefilled once.** The G episodes of a question give G identical first-round
  prompts per agent: one row is prefilled and its cache rows repeated.
* **Heads shared across rows prefilled once** (:func:`shared_heads`; vLLM and SGLang call this
  prefix caching). Every question of a batch gives agent k the same system prompt, so the
  rows of one call share long heads; each distinct head is prefilled once and seeds the cache
  of every row that starts with it, and only the rest (the task) is prefilled per row.
  Item-by-item evaluation cannot share anything this way: it is a saving of batching.
* **Prefix reuse across rounds** (:class:`PrefixStore`). An agent's prompt in every round starts
  with the same frame prefix (system prompt + task, see context.py), most of its tokens. The first
  call stores each prefix's key/value states; later calls of the same rollout (same weights) seed
  the cache with them and prefill only the rest, under an explicit padding mask and positions.

Column layout of the returned mask, per row r (``q_r`` = length of its reused prefix or shared
head, ``n_r`` = prompt length): ``[0, q_r)`` reused ids | pad to ``P`` | ``[P, P + n_r - 1 - q_r)``
rest of the prompt | pad to ``P + R`` | column ``P + R``: the last prompt id (fed by the caller as
the first one-token step) | ``max_new_tokens`` columns for generated ids.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import torch

PrefixKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each [H_kv, q, D]."""


@dataclass
class PrefixStore:
    """Key/value states of prompt prefixes for ONE rollout (the weights must not change in between)."""

    entries: dict[tuple[int, ...], PrefixKV] = field(default_factory=dict)


@dataclass
class PrefixPlan:
    """Which prompt prefixes a call may reuse (both savings are exact, see the module docstring)."""

    lens: list[int] | None = None
    """per row, the length of its reusable frame prefix (0 = none); None: no prefixes"""
    store: PrefixStore | None = None
    """prefixes stored by earlier calls of the same rollout (None: neither read nor write)"""
    share_heads: bool = True
    """prefill heads common to several rows once (:func:`shared_heads`); off only for checks"""


@dataclass(frozen=True)
class CacheLayout:
    """What the KV cache of one call looks like: fixed for a decoder, except ``max_new_tokens``."""

    pad_id: int
    max_new_tokens: int
    device: Any
    cache_kw: str
    """the model's name for the cache argument (see :func:`components.mas.decode.cache_kwarg`)"""
    static: bool = False
    """hand the decoder a StaticCache (fixed shapes for a compiled step); the prefill and all its savings
    run on a DynamicCache that is then copied into it (:func:`to_static`)"""
    keep_dynamic: bool = False
    """return the prefilled DynamicCache as it is (:mod:`components.mas.static_decode` copies it into its pool)"""


@dataclass
class Prefill:
    cache: Any
    mask: torch.Tensor
    """[B, last_col + 1 + max_new_tokens] long attention mask (see module docstring)"""
    last_col: int
    """column of the last prompt id: the caller's first one-token step"""
    reused_tokens: int = 0
    """prompt ids not prefilled in this call: served from stored prefixes or from shared heads"""


def new_cache(model: Any) -> Any:
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


def to_static(model: Any, cache: Any, max_len: int) -> Any:
    """A ``StaticCache`` of ``max_len`` columns holding ``cache``'s key/values in its first columns.

    The prefill's savings (dedup, shared heads, stored prefixes) build a DynamicCache whose layout
    varies from call to call; the compiled one-token step wants fixed shapes. Copying the prompt's
    key/values once (one [B, H_kv, L, D] copy per layer, no forward) gives both.
    """
    from transformers import StaticCache

    static = StaticCache(config=model.config, max_cache_len=max_len)
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "keys", None) is not None:  # nothing prefilled (one-id prompts): stays lazy
            static.update(layer.keys, layer.values, i)
    return static


def _in_place_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        """A DynamicLayer over a preallocated [B, H_kv, max_len, D] buffer: ``update`` writes the new
        columns in place and returns views of the filled ones. DynamicLayer concatenates instead,
        copying the whole cache every step (a fifth of a tiny model's decode time on CPU)."""

        def __init__(self, max_len: int) -> None:
            super().__init__()
            self.max_len, self.filled = max_len, 0

        def _allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            b, h, _, _ = keys.shape
            self.buf_k = keys.new_empty((b, h, self.max_len, keys.shape[-1]))
            self.buf_v = values.new_empty((b, h, self.max_len, values.shape[-1]))
            self.device, self.is_initialized = keys.device, True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self._allocate(key_states, value_states)
            end = self.filled + key_states.shape[-2]
            self.buf_k[:, :, self.filled: end] = key_states
            self.buf_v[:, :, self.filled: end] = value_states
            self.filled = end
            self.keys, self.values = self.buf_k[:, :, :end], self.buf_v[:, :, :end]
            return self.keys, self.values

    return InPlaceLayer


def to_in_place(cache: Any, max_len: int) -> Any:
    """``cache`` (a prefilled DynamicCache) as a cache of ``max_len`` preallocated columns that decode
    steps fill in place (one copy of the prompt's key/values now, none per step)."""
    from transformers.cache_utils import Cache

    layer_cls = _in_place_layer_class()
    layers = []
    for layer in cache.layers:
        new = layer_cls(max_len)
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            new.update(layer.keys, layer.values)
        layers.append(new)
    return Cache(layers=layers)


MIN_SHARED_HEAD = 16
"""shortest head worth sharing across rows (below it the extra call costs more than it saves)"""


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


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def shared_heads(prompts: list[list[int]], min_len: int = MIN_SHARED_HEAD
                 ) -> tuple[list[int], list[tuple[int, ...]], list[int]]:
    """Heads (leading ids) that distinct prompts of one call have in common.

    Returns ``(q, heads, donor)``: ``q[r]`` = length of the longest head row r shares with another
    row (0 when under ``min_len``; always < ``len(prompts[r])``, the last id is the decode step's),
    ``heads`` = the distinct maximal heads, to be prefilled once each, and ``donor[r]`` = the index
    of a head whose first ``q[r]`` ids are row r's head (-1 when ``q[r]`` is 0). A causal LM's
    key/values for a head's first k ids are the key/values of those k ids alone, so one prefill
    of a maximal head serves every shorter head it starts with. Sorting makes rows with common
    heads adjacent, so each row's longest shared head is its longer common prefix with a neighbour.
    """
    n = len(prompts)
    order = sorted(range(n), key=lambda i: prompts[i])
    adj = [min(_lcp(prompts[a], prompts[b]), len(prompts[a]) - 1, len(prompts[b]) - 1)
           for a, b in zip(order, order[1:], strict=False)]
    q = [0] * n
    for k, i in enumerate(order):
        best = max(adj[k - 1] if k > 0 else 0, adj[k] if k < n - 1 else 0)
        q[i] = best if best >= min_len else 0
    keys = sorted({tuple(prompts[i][: q[i]]) for i in range(n) if q[i]})
    if not keys:
        return q, [], [-1] * n
    # a head is maximal unless the next one in sorted order extends it
    heads = [h for h, nxt in zip(keys, [*keys[1:], ()], strict=True) if nxt[: len(h)] != h]
    donor = [-1] * n
    for i in range(n):
        if q[i]:
            key = tuple(prompts[i][: q[i]])
            donor[i] = bisect.bisect_left(heads, key)
            assert heads[donor[i]][: q[i]] == key
    return q, heads, donor


def _prefill_heads(model: Any, heads: list[tuple[int, ...]], pad_id: int, device: Any, cache_kw: str) -> list[PrefixKV]:
    """Key/values of each head: one right-padded, mask-free forward (pads follow every real id)."""
    ids = torch.full((len(heads), max(map(len, heads))), pad_id, dtype=torch.long)
    for i, h in enumerate(heads):
        ids[i, : len(h)] = torch.tensor(h, dtype=torch.long)
    cache = new_cache(model)
    model(input_ids=ids.to(device), use_cache=True, logits_to_keep=1, **{cache_kw: cache})
    return [[(layer.keys[i, :, : len(h)], layer.values[i, :, : len(h)]) for layer in cache.layers]
            for i, h in enumerate(heads)]


def _seeds(model: Any, uniq: list[list[int]], u_lens: list[int] | None, plan: PrefixPlan, layout: CacheLayout
           ) -> tuple[list[int], list[PrefixKV | None], int, bool]:
    """Per unique row: (reused length q, its key/values or None); tokens not prefilled; whether the
    seeds came from the store. Stored frame prefixes (later rounds) first, else shared heads."""
    q = _reusable(uniq, u_lens, plan.store)
    if any(q):
        assert plan.store is not None
        return q, [plan.store.entries[tuple(p[:n])] for p, n in zip(uniq, q, strict=True)], sum(q), True
    none: list[PrefixKV | None] = [None] * len(uniq)
    if not plan.share_heads or len(uniq) < 2:
        return q, none, 0, False
    q, heads, donor = shared_heads(uniq)
    saved = sum(q) - sum(map(len, heads))
    if saved < MIN_SHARED_HEAD:
        return [0] * len(uniq), none, 0, False
    kv = _prefill_heads(model, heads, layout.pad_id, layout.device, layout.cache_kw)
    seeds = [[(k[:, :n], v[:, :n]) for k, v in kv[d]] if n else None for n, d in zip(q, donor, strict=True)]
    return q, seeds, saved, False


@torch.no_grad()
def prefill(model: Any, prompts: list[list[int]], layout: CacheLayout, plan: PrefixPlan) -> Prefill:
    """Fill a KV cache with ``prompts[r][:-1]`` for every row; see the module docstring.

    ``plan.lens[r]``: length of row r's reusable prefix (0 = none). With a ``plan.store``, prefixes
    already stored are reused, and a call that reused none stores the prefixes it computed.
    """
    pad_id, max_new_tokens, device = layout.pad_id, layout.max_new_tokens, layout.device
    b = len(prompts)
    slot: dict[tuple[int, ...], int] = {}
    inverse = [slot.setdefault(tuple(p), len(slot)) for p in prompts]
    dedup = len(slot) < b
    first_row = {u: r for r, u in reversed(list(enumerate(inverse)))}
    rows = [first_row[u] for u in range(len(first_row))]
    uniq = [prompts[r] for r in rows]
    u_lens = None if plan.lens is None else [plan.lens[r] for r in rows]
    q, seeds, saved, from_store = _seeds(model, uniq, u_lens, plan, layout)
    p_cols = max(q)
    r_cols = max(len(p) - 1 - n for p, n in zip(uniq, q, strict=True))
    last_col = p_cols + r_cols
    mask = torch.zeros((b, last_col + 1 + max_new_tokens), dtype=torch.long)
    for r, p in enumerate(prompts):
        n = q[inverse[r]]
        mask[r, :n] = 1
        mask[r, p_cols: p_cols + len(p) - 1 - n] = 1
    mask[:, last_col] = 1
    mask = mask.to(device)
    cache = new_cache(model)
    if p_cols:  # seed the cache with the reused heads / prefixes, right-padded to p_cols
        ref = next(s for s in seeds if s is not None)
        for layer, (k0, v0) in enumerate(ref):
            keys = k0.new_zeros((len(uniq), k0.shape[0], p_cols, k0.shape[-1]))
            values = v0.new_zeros((len(uniq), v0.shape[0], p_cols, v0.shape[-1]))
            for i, kv in enumerate(seeds):
                if kv is not None:
                    keys[i, :, : kv[layer][0].shape[1]] = kv[layer][0]
                    values[i, :, : kv[layer][1].shape[1]] = kv[layer][1]
            cache.update(keys, values, layer)
    if r_cols:
        ids = torch.full((len(uniq), r_cols), pad_id, dtype=torch.long)
        for i, (p, n) in enumerate(zip(uniq, q, strict=True)):
            rest = p[n:-1]
            ids[i, : len(rest)] = torch.tensor(rest, dtype=torch.long)
        kwargs: dict[str, Any] = {"use_cache": True, "logits_to_keep": 1, layout.cache_kw: cache}
        if p_cols:  # holes between each head/prefix and the rest: explicit mask and positions
            sel = torch.tensor(rows, device=mask.device)
            kwargs["attention_mask"] = mask[sel, : p_cols + r_cols]
            kwargs["position_ids"] = (torch.tensor(q)[:, None] + torch.arange(r_cols)[None, :]).to(device)
        model(input_ids=ids.to(device), **kwargs)
    if plan.store is not None and u_lens is not None and not from_store:
        _store_prefixes(cache, plan.store, uniq, u_lens, q, p_cols)
    if dedup:
        cache.batch_select_indices(torch.tensor(inverse, device=device))
    if layout.keep_dynamic:
        return Prefill(cache, mask, last_col, saved)
    cache = to_static(model, cache, mask.shape[1]) if layout.static else to_in_place(cache, mask.shape[1])
    return Prefill(cache, mask, last_col, saved)


def _store_prefixes(cache: Any, store: PrefixStore, prompts: list[list[int]], prefix_lens: list[int],
                    q: list[int], p_cols: int) -> None:
    """Copy each row's prefix states into ``store``: its first ``q`` ids sit at columns [0, q), the
    rest of the prompt from column ``p_cols`` on (see the module docstring's layout)."""
    for i, (p, n) in enumerate(zip(prompts, prefix_lens, strict=True)):
        key = tuple(p[:n])
        if 0 < n < len(p) and key not in store.entries:
            h = min(q[i], n)
            store.entries[key] = [
                (torch.cat([layer.keys[i, :, :h], layer.keys[i, :, p_cols: p_cols + n - h]], dim=1),
                 torch.cat([layer.values[i, :, :h], layer.values[i, :, p_cols: p_cols + n - h]], dim=1))
                for layer in cache.layers]
