"""The graph-capturable decode step (``mas.decode: static_graph``): a persistent static KV-cache pool
and a per-token step with no host synchronisation, replayed as one CUDA graph per shape.

Why: on an H200 the eager decode step of SmolLM2's shape is host-bound (~24 ms for 32 rows, ~1,200
kernel launches, bench/README.md) while its arithmetic needs well under 1 ms. A CUDA graph replays
all of a step's kernels with one launch, but only if every tensor the step touches keeps its
address and shape and nothing in it reads the device from the host. So:

* **Pool** (:class:`StaticPool`): one :class:`_Slot` per bucketed shape ``(rows, cache length,
  max_new_tokens)``: rows rounded up to a power of two (>= 8), the cache length to a multiple of 64.
  A slot owns its KV buffers ([R, H_kv, L, D] per layer), the step's inputs (ids, positions, the
  write column, the 4-D padding mask) and its outputs (ids, log-probs, lengths, done flags), all
  allocated once and reused by every later call of that shape (at most ``max_slots`` kept).
  Padding rows are "done" from the start: they decode pad ids nobody reads.
* **Step** (:meth:`StaticPool._step`): the model forward on the slot's cache, every first-token
  rule of :class:`components.mas.decode.Decoder` (EOS masked under ``min_new_tokens``, the silence
  token masked after the first step or always, ``must_answer``'s banned first ids) written as
  ``torch.where`` on a device-side step counter, and sampling (argmax, or inverse-CDF with the
  pool's device-side generator, seeded from the caller's generator once per call).
* **Stop check every k tokens** (``mas.stop_check_every``): the host reads ``done.all()`` once per k
  steps; steps after every row is done write pads and count nothing, so ids, log-probs and
  ``steps`` (the longest completion) do not depend on k.

A captured graph reads the weights by address: the trainers update them in place (the torch
engine copies its fp32 masters into the same parameters; DeepSpeed writes its partitions back into
them), so a rollout after an update decodes with the new weights. Rebinding a parameter to a new
tensor would leave the graph on the old one.

On CUDA (``capture=True``) the first call of a shape warms the step up on a side stream and
captures it in a ``torch.cuda.CUDAGraph``; ``capture_s`` reports that time apart from the steps.
A step that cannot be captured (an older torch without ``register_generator_state``, an op that
syncs) falls back to running eagerly, and ``capture_error`` says why. On CPU the same step runs
eagerly: tests check it against the dynamic decoder (same greedy ids and log-probs).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from components.mas.prefill import CacheLayout, PrefixPlan, prefill
from components.mas.sampling import Generation, sample_from, top_p_filter

LEN_BUCKET = 64
MIN_ROWS = 8


def row_bucket(rows: int) -> int:
    """Rows padded to the next power of two, at least ``MIN_ROWS`` (few shapes, few graphs)."""
    return max(MIN_ROWS, 1 << (rows - 1).bit_length())


def len_bucket(cols: int) -> int:
    return -(-cols // LEN_BUCKET) * LEN_BUCKET


def _pool_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class PoolLayer(DynamicLayer):
        """Fixed [R, H_kv, L, D] buffers; ``update`` writes the step's column at the shared device
        index ``write`` (no host read, unlike transformers' own layers across versions) and returns
        the whole buffers: the padding mask hides columns not written yet."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, write: torch.Tensor) -> None:
            super().__init__()
            self.keys, self.values, self.write = keys, values, write
            self.device, self.is_initialized = keys.device, True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys.index_copy_(2, self.write, key_states)
            self.values.index_copy_(2, self.write, value_states)
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.keys.shape[-2]

    return PoolLayer


@dataclass
class _Slot:
    """Every tensor one shape's step reads or writes (fixed addresses: what a CUDA graph needs)."""

    rows: int
    cols: int
    n_new: int
    cache: Any
    ids: torch.Tensor        # [R, 1] long: the id each row feeds next
    pos: torch.Tensor        # [R, 1] long: its position id
    write: torch.Tensor      # [1] long: the cache column the step writes (the same for every row)
    mask: torch.Tensor       # [R, 1, 1, L] bool, True = attend
    t: torch.Tensor          # [1] long: the step counter
    toks: torch.Tensor       # [R, N] long
    lps: torch.Tensor        # [R, N] float32
    lengths: torch.Tensor    # [R] long
    done: torch.Tensor       # [R] bool
    sil: torch.Tensor        # [R] float32: P(silence first)
    first_masked: torch.Tensor  # [R] bool: rows that may not start with a banned id
    temp: torch.Tensor       # [1] float32
    min_new: torch.Tensor    # [1] long
    graphs: dict[tuple, Any] = field(default_factory=dict)


class StaticPool:
    """Static-shape decoding for one :class:`~components.mas.decode.Decoder` (see the module docstring)."""

    def __init__(self, decoder: Any, *, stop_check_every: int = 1, capture: bool | None = None,
                 max_slots: int = 4) -> None:
        self.dec, self.every, self.max_slots = decoder, max(1, int(stop_check_every)), max_slots
        self.capture = decoder.device.type == "cuda" if capture is None else capture
        self.slots: OrderedDict[tuple[int, int, int], _Slot] = OrderedDict()
        self.gen = torch.Generator(device=decoder.device)
        self.capture_s = 0.0
        """seconds spent warming up and capturing graphs (all calls so far), apart from decode steps"""
        self.capture_error: str | None = None
        cfg = decoder.model.config
        self._kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self._head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self._layers = int(cfg.num_hidden_layers)
        self._dtype = next(decoder.model.parameters()).dtype
        self._sdpa = getattr(cfg, "_attn_implementation", None) == "sdpa"

    # -- the pool --------------------------------------------------------------------------------
    def _slot(self, rows: int, cols: int, n_new: int) -> _Slot:
        key = (row_bucket(rows), len_bucket(cols), n_new)
        if key in self.slots:
            self.slots.move_to_end(key)
            return self.slots[key]
        while len(self.slots) >= self.max_slots:
            self.slots.popitem(last=False)
        r, L, n = key
        dev = self.dec.device
        from transformers.cache_utils import Cache

        write = torch.zeros(1, dtype=torch.long, device=dev)
        shape = (r, self._kv_heads, L, self._head_dim)
        layer_cls = _pool_layer_class()
        cache = Cache(layers=[layer_cls(torch.zeros(shape, dtype=self._dtype, device=dev),
                                        torch.zeros(shape, dtype=self._dtype, device=dev), write)
                              for _ in range(self._layers)])
        longs = dict(dtype=torch.long, device=dev)
        slot = _Slot(r, L, n, cache, torch.zeros((r, 1), **longs), torch.zeros((r, 1), **longs), write,
                     torch.zeros((r, 1, 1, L), dtype=torch.bool, device=dev), torch.zeros(1, **longs),
                     torch.zeros((r, n), **longs), torch.zeros((r, n), dtype=torch.float32, device=dev),
                     torch.zeros(r, **longs), torch.zeros(r, dtype=torch.bool, device=dev),
                     torch.zeros(r, dtype=torch.float32, device=dev), torch.zeros(r, dtype=torch.bool, device=dev),
                     torch.ones(1, dtype=torch.float32, device=dev), torch.zeros(1, **longs))
        self.slots[key] = slot
        return slot

    # -- the step --------------------------------------------------------------------------------
    def _step(self, s: _Slot, greedy: bool, top_p: float, t_host: int | None = None) -> None:
        """One token for every row, entirely on the device (``t_host`` only for a logits processor)."""
        dec, stops, neg = self.dec, self.dec.stops, float("-inf")
        s.mask.index_fill_(-1, s.write, True)
        mask = s.mask if self._sdpa else torch.where(s.mask, 0.0, torch.finfo(self._dtype).min).to(self._dtype)
        out = dec.model(input_ids=s.ids, attention_mask=mask, position_ids=s.pos, use_cache=True,
                        **{dec.cache_kw: s.cache})
        logits = out.logits[:, -1, :].float()
        t = s.t
        if dec.logits_processor is not None:
            logits = dec.logits_processor(logits, int(t_host or 0))
        logits[:, stops.eos] = torch.where(t < s.min_new, neg, logits[:, stops.eos])
        if stops.silence is not None:
            sil_col = logits[:, stops.silence]
            logits[:, stops.silence] = torch.where(t > 0, neg, sil_col) if stops.silence_first else neg
            if stops.silence_first and dec.first_banned is not None:
                ban = s.first_masked[:, None] & dec.first_banned[None, :] & (t == 0)
                logits = logits.masked_fill(ban, neg)
        logp_all = torch.log_softmax(logits / s.temp, dim=-1)
        if stops.silence is not None:
            s.sil.copy_(torch.where(t == 0, logp_all[:, stops.silence].exp(), s.sil))
        if greedy:
            nxt = logits.argmax(-1)
        else:
            probs = logp_all.exp()
            if top_p < 1.0:
                probs = top_p_filter(probs, top_p)
            nxt = sample_from(probs, self.gen)
        nxt = nxt.masked_fill(s.done, stops.pad)
        col = t.view(1, 1).expand(s.rows, 1)
        s.toks.scatter_(1, col, nxt[:, None])
        s.lps.scatter_(1, col, logp_all.gather(-1, nxt[:, None]))
        s.lengths.add_((~s.done).long())
        fin = nxt == stops.eos
        if stops.silence is not None:
            fin = fin | ((nxt == stops.silence) & (t == 0))
        s.done.logical_or_(fin)
        s.ids.copy_(nxt[:, None])
        s.pos.add_(1)
        s.write.add_(1)
        s.t.add_(1)

    def _reset(self, s: _Slot) -> None:
        """A harmless state for warm-up and capture (``_load`` overwrites everything a call reads)."""
        for x in (s.ids, s.pos, s.write, s.t, s.lengths, s.min_new):
            x.zero_()
        s.mask.zero_()
        s.mask[..., 0] = True
        s.done.fill_(True)

    def _graph(self, s: _Slot, greedy: bool, top_p: float) -> Any:
        """The captured step for this slot and sampling mode, or None (eager) where capture fails."""
        key = (greedy, top_p)
        if not self.capture or self.dec.logits_processor is not None or self.capture_error is not None:
            return None
        if key in s.graphs:
            return s.graphs[key]
        t0 = time.perf_counter()
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._reset(s)
                    self._step(s, greedy, top_p)
            torch.cuda.current_stream().wait_stream(stream)
            self._reset(s)
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(self.gen)
            with torch.cuda.graph(graph):
                self._step(s, greedy, top_p)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any capture failure falls back to the eager step
            self.capture_error = f"{type(e).__name__}: {e}"
            graph = None
        self.capture_s += time.perf_counter() - t0
        s.graphs[key] = graph
        return graph

    # -- one call --------------------------------------------------------------------------------
    def _load(self, s: _Slot, pre: Any, prompts: list[list[int]], sampling: Any,
              first_masked: list[bool] | None) -> None:
        b, dev, col = len(prompts), self.dec.device, pre.last_col
        for layer, src in zip(s.cache.layers, pre.cache.layers, strict=True):
            if getattr(src, "keys", None) is not None and src.keys.numel():
                n = src.keys.shape[-2]
                layer.keys[:b, :, :n] = src.keys
                layer.values[:b, :, :n] = src.values
        s.mask.zero_()
        s.mask[:b, 0, 0, : col + 1] = pre.mask[:, : col + 1].bool()
        s.mask[b:, 0, 0, col] = True
        s.ids.fill_(self.dec.stops.pad)
        s.ids[:b, 0] = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=dev)
        s.pos.zero_()
        s.pos[:b, 0] = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long, device=dev)
        s.write.fill_(col)
        s.t.zero_()
        s.toks.fill_(self.dec.stops.pad)
        s.lps.zero_()
        s.lengths.zero_()
        s.done.fill_(True)
        s.done[:b] = False
        s.sil.zero_()
        s.first_masked.zero_()
        if first_masked is not None:
            s.first_masked[:b] = torch.tensor(first_masked, dtype=torch.bool, device=dev)
        s.temp.fill_(sampling.temp)
        s.min_new.fill_(sampling.min_new_tokens)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Any, generator: torch.Generator | None,
                 plan: PrefixPlan | None, first_masked: list[bool] | None) -> Any:

        dec, b, n_new = self.dec, len(prompts), sampling.max_new_tokens
        layout = CacheLayout(dec.stops.pad, n_new, dec.device, dec.cache_kw, keep_dynamic=True)
        pre = prefill(dec.model, prompts, layout, plan or PrefixPlan())
        s = self._slot(b, pre.last_col + n_new, n_new)
        greedy = bool(sampling.greedy or sampling.temperature <= 0)
        top_p = 1.0 if greedy else float(sampling.top_p)
        graph = self._graph(s, greedy, top_p)
        self._load(s, pre, prompts, sampling, first_masked)
        if not greedy:
            seed = torch.randint(0, 2**62, (1,), generator=generator, device=generator.device) if generator \
                else torch.randint(0, 2**62, (1,))
            self.gen.manual_seed(int(seed))
        t = 0
        while t < n_new:
            for _ in range(min(self.every, n_new - t)):
                if graph is not None:
                    graph.replay()
                else:
                    self._step(s, greedy, top_p, t)
                t += 1
            if bool(s.done.all()):  # the stop check, once per ``every`` tokens
                break
        toks, lps, lens = s.toks[:b].cpu().tolist(), s.lps[:b].cpu().tolist(), s.lengths[:b].cpu().tolist()
        sil = s.sil[:b].cpu().tolist() if dec.stops.silence is not None else None
        return Generation([toks[r][: lens[r]] for r in range(b)], [lps[r][: lens[r]] for r in range(b)],
                          max(lens), pre.reused_tokens, sil, capture_s=self.capture_s)
