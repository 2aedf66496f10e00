"""Batched sampling loop over a KV cache: one call generates every agent turn of a round (or wave).

Why a hand-written loop rather than ``model.generate``: we need, per row, the sampled ids up to and
including EOS, without padding, and the behaviour log-prob of each id, in the same pass. ``generate``
returns processed scores for every row at every step (a (B, V) tensor per step kept until the end)
plus per-call set-up of logits processors, stopping criteria and cache classes; on CPU with small
models that fixed overhead dominates. The loop below is ~40 lines: a prefill (:mod:`components.mas.prefill`:
mask-free, shared prompts once, prompt prefixes reused across rounds), then one (B, 1) forward per step on a
preallocated cache filled in place (or a ``StaticCache``), with explicit position ids and a padding
mask; its cost grows with the longest message, never with the number of rows. Batched and one-row
greedy decoding give identical ids (tested), which is the padding correctness check.

Log-probs stored: ``log_softmax(logits / T)`` of the sampled id, i.e. the sampling distribution at
temperature T *before* top-p truncation (T = 1 when greedy). That is what a trainer can recompute
from the model alone with the same temperature; the GSPO trainer recomputes old log-probs once per
rollout batch anyway, so these are for diagnostics and off-policy checks. A caller's
``logits_processor`` (e.g. a bias) is applied first and is part of the sampling distribution.

Silence (:mod:`components.models.silence`): the silence token may only be a reply's first token.
Its logit is masked at every later step (and at every step when ``StopIds.silence_first`` is off,
for lone solvers; at the first step too on the rows ``generate`` is told may not be silent), exactly
as the trainer masks it (:func:`components.gspo.logprobs.completion_logprobs`), so behaviour,
π_old and π_θ are the same distribution. A row that starts with it stops there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from components.mas.prefill import CacheLayout, PrefixPlan, prefill
from components.mas.sampling import Generation, sample_from, top_p_filter
from components.mas.static_decode import StaticPool
from components.progress import leaf

LogitsProcessor = Callable[[torch.Tensor, int], torch.Tensor]
"""(logits (B, V) float32, step) -> logits (B, V)"""


def cache_kwarg(model) -> str:
    """transformers 5.x names the cache argument ``cache``; 4.x ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass(frozen=True)
class Sampling:
    """How one call samples: length limits and the sampling distribution."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    """argmax decoding (log-probs then at temperature 1)"""
    min_new_tokens: int = 0
    """EOS is masked for this many steps (benchmarks use it for fixed-length messages)"""

    @property
    def temp(self) -> float:
        """The temperature log-probs are taken at: 1 when greedy or temperature 0."""
        return 1.0 if self.greedy or self.temperature <= 0 else float(self.temperature)


@dataclass(frozen=True)
class StopIds:
    """Token ids that end or pad a reply, and the silence token."""

    eos: int
    pad: int
    silence: int | None = None
    """the silence token (one special token), or None when the model has none"""
    silence_first: bool = True
    """the silence token may start a reply (and then ends it); False: it is never sampled"""


@dataclass(frozen=True)
class DecodeOptions:
    """How a :class:`Decoder` decodes: the ``mas`` keys ``static_cache``, ``decode`` and
    ``stop_check_every`` as the engine resolves them for its device (see :class:`Decoder`)."""

    static_cache: bool = False
    compile_backend: str | None = None
    graph: bool = False
    stop_check_every: int = 1


class Decoder:
    """Batched sampling with one model: ``generate`` runs one call (see the module docstring).

    ``options`` (:class:`DecodeOptions`): ``static_cache`` decodes on a StaticCache (fixed shapes:
    what a compiled step needs; the prefill and its savings are unchanged, see
    :func:`components.mas.prefill.to_static`). ``compile_backend`` compiles the one-token step with
    ``torch.compile(backend=...)`` (``"inductor"`` on CUDA; tests use ``"eager"``); None runs the
    model as it is. ``logits_processor`` (tests, benchmarks) is
    applied to every step's logits before sampling and is part of the distribution.

    The step's padding mask: with SDPA attention on CPU, and on the static cache, it is passed as a
    ready 4-D boolean mask; otherwise as the 2-D mask transformers turns into its own. Measured on
    SmolLM2-135M's shape, ms per decode step: on an H200 in bf16, 32 rows
    (``bench/decode_step.py``), the 4-D mask 33.5 against 24.4 for the 2-D one, the same as
    ``model.generate`` (24.5): the ready boolean mask costs a conversion in every layer there. On
    2 CPU cores, 8 rows, the two cost the same (68.0 / 67.4 / 68.8 against 67.9 / 69.3 / 67.3
    with 64-id prompts, 73 against 73 with 200), so the CPU keeps the mask every committed result
    was decoded with; the compiled static cache keeps the one it was verified with.

    Host-device synchronisation: the stop check ``bool(done.all())`` once per generated token
    (and, with the 2-D mask, transformers' own check whether it may drop the mask).

    ``graph`` (``mas.decode: static_graph``) hands every call to a
    :class:`components.mas.static_decode.StaticPool`: pooled static buffers, a step with no host
    read, captured as a CUDA graph on CUDA, the stop check once per ``stop_check_every`` tokens.
    """

    def __init__(self, model, stops: StopIds, *, device: str | torch.device = "cpu",
                 options: DecodeOptions | None = None, logits_processor: LogitsProcessor | None = None,
                 first_banned: torch.Tensor | None = None) -> None:
        options = options or DecodeOptions()
        static_cache, compile_backend = options.static_cache, options.compile_backend
        self.model, self.stops, self.device = model, stops, torch.device(device)
        self.cache_kw = cache_kwarg(model)
        self.first_banned = None if first_banned is None else first_banned.to(self.device)
        """[V] bool: ids a ``no_silence`` row may not start with (the silence token among them)"""
        self.static_cache = static_cache
        self.logits_processor = logits_processor
        self.step_fn = model if compile_backend is None else torch.compile(model, backend=compile_backend,
                                                                           dynamic=True)
        sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.mask_4d = sdpa and (self.device.type == "cpu" or static_cache)
        """pass the step's padding mask as a ready [B, 1, 1, L] boolean mask (see the class docstring)"""
        self.pool = None
        """``mas.decode: static_graph``: the static KV-cache pool and captured step (static_decode.py)"""
        if options.graph:
            self.pool = StaticPool(self, stop_check_every=options.stop_check_every)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling, generator: torch.Generator | None = None,
                 plan: PrefixPlan | None = None, no_silence: list[bool] | None = None) -> Generation:
        """Sample a completion for every prompt (B id lists of any lengths) in one batched decode.

        Rows stop at EOS, at a stop reply, or after ``sampling.max_new_tokens``. ``plan``: reusable
        prompt prefixes (see prefill.py; exact, so they never change the ids). ``no_silence``: per
        row, True masks every id of the decoder's ``first_banned`` at the first step
        (``mas.must_answer``'s speaker).
        """
        b = len(prompts)
        if b == 0:
            return Generation([], [], 0)
        if min(len(p) for p in prompts) == 0:
            raise ValueError("Decoder.generate needs non-empty prompts")
        stops, device, n_new = self.stops, self.device, sampling.max_new_tokens
        first_rows = None  # rows that may not start with any id of first_banned
        if no_silence is not None and any(no_silence) and stops.silence is not None:
            if self.first_banned is None:
                raise ValueError("Decoder.generate: no_silence rows need the decoder's first_banned mask")
            first_rows = list(no_silence)
        if self.pool is not None:
            return self.pool.generate(prompts, sampling, generator, plan, first_rows)
        layout = CacheLayout(stops.pad, n_new, device, self.cache_kw, self.static_cache)
        pre = prefill(self.model, prompts, layout, plan or PrefixPlan())
        cache, col = pre.cache, pre.last_col
        # [B, 1, 1, L] bool (SDPA: True = attend) or the [B, L] long mask; columns > col + t are still 0
        full_mask = pre.mask.bool()[:, None, None, :] if self.mask_4d else pre.mask
        last_ids = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=device)
        last_pos = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long, device=device)
        mask = full_mask if self.static_cache else full_mask[..., : col + 1]
        out = self.step_fn(input_ids=last_ids[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                           use_cache=True, **{layout.cache_kw: cache})
        toks = torch.full((b, n_new), stops.pad, dtype=torch.long, device=device)
        lps = torch.zeros((b, n_new), dtype=torch.float32, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        lengths = torch.zeros(b, dtype=torch.long, device=device)
        silence_prob: torch.Tensor | None = None
        first_masked = None if first_rows is None else torch.tensor(first_rows, dtype=torch.bool, device=device)
        steps = 0
        progress = leaf("decode", n_new, "tokens")
        for t in range(n_new):
            logits = out.logits[:, -1, :].float()
            if self.logits_processor is not None:
                logits = self.logits_processor(logits, t)
            if t < sampling.min_new_tokens:
                logits[:, stops.eos] = float("-inf")
            if stops.silence is not None and (t > 0 or not stops.silence_first):
                logits[:, stops.silence] = float("-inf")
            elif t == 0 and first_masked is not None:
                logits = logits.masked_fill(first_masked[:, None] & self.first_banned[None, :], float("-inf"))
            logp_all = torch.log_softmax(logits / sampling.temp, dim=-1)
            if t == 0 and stops.silence is not None:
                silence_prob = logp_all[:, stops.silence].exp()
            if sampling.greedy or sampling.temperature <= 0:
                nxt = logits.argmax(-1)
            else:
                probs = logp_all.exp()
                if sampling.top_p < 1.0:
                    probs = top_p_filter(probs, sampling.top_p)
                nxt = sample_from(probs, generator)
            nxt = nxt.masked_fill(done, stops.pad)
            toks[:, t] = nxt
            lps[:, t] = logp_all.gather(-1, nxt[:, None]).squeeze(-1)
            lengths += (~done).long()
            done = done | (nxt == stops.eos)
            if t == 0 and stops.silence is not None:
                done = done | (nxt == stops.silence)
            steps = t + 1
            progress.advance()
            if t == n_new - 1 or bool(done.all()):  # the one host-device sync per token
                break
            last_pos = last_pos + 1
            full_mask[..., col + 1 + t] = 1
            if not self.static_cache:
                mask = full_mask[..., : col + t + 2]
            out = self.step_fn(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                               use_cache=True, **{layout.cache_kw: cache})
        toks_l, lps_l, lens = toks.cpu().tolist(), lps.cpu().tolist(), lengths.cpu().tolist()
        return Generation([toks_l[r][:lens[r]] for r in range(b)], [lps_l[r][:lens[r]] for r in range(b)], steps,
                          pre.reused_tokens, None if silence_prob is None else silence_prob.cpu().tolist())
