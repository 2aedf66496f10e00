"""The decode loop's own pieces: inverse-CDF sampling and the prefill's savings (shared prompts,
heads shared across rows, prefixes reused across rounds), each checked against a plain prefill."""

from __future__ import annotations

import torch
from helpers.host_reads import count_host_reads

from components.mas.decode import DecodeOptions, Decoder, Sampling, StopIds, sample_from
from components.mas.prefill import PrefixPlan
from components.models.tiny import build_tiny_model


def generate(model, tok, prompts, new: int, *, min_new: int = 0, silence=None, **plan):
    """Greedy decode of ``prompts`` with ``new`` tokens; ``plan`` = PrefixPlan fields."""
    decoder = Decoder(model, StopIds(int(tok.eos_token_id), int(tok.pad_token_id), silence))
    return decoder.generate(prompts, Sampling(new, greedy=True, min_new_tokens=min_new), None, PrefixPlan(**plan))


def test_sampler_matches_the_distribution_and_never_draws_zero_mass():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    g = torch.Generator().manual_seed(0)
    draws = sample_from(probs.expand(20_000, -1).contiguous(), g)
    freq = torch.bincount(draws, minlength=6).double() / draws.numel()
    assert freq[[0, 2, 5]].sum() == 0  # zero-probability ids (incl. the last one) never appear
    # 20k draws: binomial std <= 0.0036, so 0.015 is > 4 sigma
    torch.testing.assert_close(freq, probs.double(), atol=0.015, rtol=0)
    # unnormalised rows and a one-hot row
    rows = torch.tensor([[0.0, 2.0, 2.0], [0.0, 0.0, 1.0]])
    out = sample_from(rows.repeat(500, 1), g)
    assert set(out[1::2].tolist()) == {2} and set(out[0::2].tolist()) == {1, 2}


def test_sampler_is_deterministic_per_generator_seed():
    probs = torch.softmax(torch.randn(8, 50, generator=torch.Generator().manual_seed(1)), -1)
    a = sample_from(probs, torch.Generator().manual_seed(7))
    b = sample_from(probs, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_repeated_prompts_are_prefilled_once_and_decode_like_lone_rows():
    model, tok = build_tiny_model(0)
    model.eval()
    p1, p2 = list(range(5, 40)), list(range(50, 62))
    prompts = [p1, p2, p1, p1, p2]  # 2 unique prompts, 5 rows
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        gen = generate(model, tok, prompts, 6, min_new=6)
    finally:
        hook.remove()
    assert calls[0] == (2, len(p1) - 1)  # the prefill saw the 2 unique prompts only
    assert all(shape[0] == 5 for shape in calls[1:])
    for r, p in enumerate(prompts):
        lone = generate(model, tok, [p], 6, min_new=6)
        assert gen.ids[r] == lone.ids[0]
        torch.testing.assert_close(torch.tensor(gen.logprobs[r]), torch.tensor(lone.logprobs[0]), atol=1e-5, rtol=0)


def test_stored_prefixes_are_reused_and_decode_like_a_fresh_prefill():
    """Round-2-like prompts (stored prefix + different tails) give the same greedy ids and
    log-probs as a fresh prefill; the store skipped the prefix tokens."""
    from components.mas.prefill import PrefixStore

    model, tok = build_tiny_model(0)
    model.eval()
    prefixes = [list(range(5, 30)), list(range(40, 52)), list(range(60, 100))]
    suffix = [7, 8, 9]
    store = PrefixStore()
    first = [p + suffix for p in prefixes]
    stored = generate(model, tok, first, 6, min_new=6, lens=[len(p) for p in prefixes], store=store)
    assert set(store.entries) == {tuple(p) for p in prefixes} and stored.reused_tokens == 0
    tails = [[11, 12, 13, 14, 15, 16, 17], [21], [31, 32, 33]]
    second = [p + t + suffix for p, t in zip(prefixes, tails, strict=True)]
    lens = [len(p) for p in prefixes]
    reused = generate(model, tok, second, 6, min_new=6, lens=lens, store=store)
    assert reused.reused_tokens == sum(lens)
    fresh = generate(model, tok, second, 6, min_new=6, share_heads=False)
    assert reused.ids == fresh.ids
    for a, b in zip(reused.logprobs, fresh.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    # a row whose prefix is not stored: nothing is reused (no mixed layouts), same ids
    mixed = second[:2] + [list(range(200, 230)) + suffix]
    out = generate(model, tok, mixed, 6, min_new=6, lens=lens[:2] + [30], store=store)
    assert out.reused_tokens == 0 and out.ids[:2] == fresh.ids[:2]


def test_rollout_reuses_frame_prefixes_in_later_rounds():
    """A 3-agent, 2-round rollout serves round 2's frame prefixes from round 1, and round 2's
    greedy messages equal a fresh prefill of the same prompts (no store)."""
    from components.config import MasConfig
    from components.data.item import Item
    from components.mas.engine import RolloutEngine

    model, tok = build_tiny_model(0)
    items = [Item(id=f"t/{i}", benchmark="gsm8k", question=f"What is {i} + 3?", answer=str(i + 3),
                  answer_type="numeric") for i in range(3)]
    cfg = MasConfig(agents=3, rounds=2, max_message_tokens=8)
    eng = RolloutEngine(model, tok, cfg)
    eps = eng.rollout(items, 1, seed=0, greedy=True)
    assert eng.last_stats.prefix_tokens_reused > 0
    for rnd in (0, 1):  # round 1: shared heads, then stored from the seeded layout; round 2: reused
        msgs = [m for ep in eps for m in ep.messages if m.round == rnd]
        plain = generate(model, tok, [m.prompt_ids for m in msgs], 8, silence=eng.silence_id, share_heads=False)
        assert plain.ids == [m.completion_ids for m in msgs]
        for m, lps in zip(msgs, plain.logprobs, strict=True):
            torch.testing.assert_close(torch.tensor(m.logprobs), torch.tensor(lps), atol=1e-5, rtol=0)


def test_shared_heads_finds_maximal_heads_and_their_donors():
    from components.mas.prefill import shared_heads

    sys_a, sys_b = list(range(100, 130)), list(range(200, 240))
    prompts = [sys_a + [1, 2, 3], sys_b + [4, 5], sys_a + [7, 8], sys_a + [1, 2, 9, 9],
               list(range(300, 340)), sys_b[:20] + [6, 6]]
    q, heads, donor = shared_heads(prompts, min_len=16)
    # row 0 and 3 share sys_a + [1, 2]; row 2 shares sys_a with them; row 5 shares 20 ids with row 1;
    # row 4 shares nothing
    assert q == [32, 20, 30, 32, 0, 20]
    assert sorted(heads) == sorted([tuple(sys_a + [1, 2]), tuple(sys_b[:20])])  # sys_a alone is not maximal
    for r, (n, d) in enumerate(zip(q, donor, strict=True)):
        assert (d == -1) if n == 0 else heads[d][:n] == tuple(prompts[r][:n])
    # a head never swallows a whole prompt: the last id is left for the decode step
    q2, _, _ = shared_heads([sys_a, sys_a + [5]], min_len=16)
    assert q2 == [29, 29]
    assert shared_heads([sys_a[:10] + [1], sys_a[:10] + [2]], min_len=16)[0] == [0, 0]


def test_shared_heads_are_prefilled_once_and_decode_like_a_plain_prefill():
    model, tok = build_tiny_model(0)
    model.eval()
    head_a, head_b = list(range(5, 45)), list(range(50, 80))
    prompts = [head_a + [90, 91, 92], head_b + [93], head_a + [94, 95], list(range(100, 120)),
               head_b + [96, 97, 98, 99], head_a + [90, 91, 92]]  # the last one repeats row 0
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a, k: calls.append(tuple(k["input_ids"].shape)), with_kwargs=True)
    try:
        shared = generate(model, tok, prompts, 5, min_new=5)
    finally:
        hook.remove()
    assert calls[0] == (2, 40)  # the two heads, once each
    assert calls[1] == (5, 19)  # the 5 unique prompts' rests (the longest rest: 20 - 1 ids of the lone row)
    assert shared.reused_tokens == 2 * 40 + 2 * 30 - (40 + 30)  # unique rows; the repeat costs nothing anyway
    plain = generate(model, tok, prompts, 5, min_new=5, share_heads=False)
    assert shared.ids == plain.ids
    for a, b in zip(shared.logprobs, plain.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


def _static(model, tok, prompts, new: int, *, backend=None, silence=None, seed=None, **plan):
    """Like :func:`generate` on a StaticCache (optionally a compiled step); sampled when ``seed`` is set."""
    decoder = Decoder(model, StopIds(int(tok.eos_token_id), int(tok.pad_token_id), silence),
                      options=DecodeOptions(static_cache=True, compile_backend=backend))
    sampling = Sampling(new, greedy=seed is None, min_new_tokens=new)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    return decoder.generate(prompts, sampling, gen, PrefixPlan(**plan))


def _same(a, b) -> None:
    assert a.ids == b.ids and a.steps == b.steps and a.reused_tokens == b.reused_tokens
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=1e-5, rtol=0)


def test_static_cache_decodes_like_the_dynamic_cache_with_every_prefill_saving():
    """The static-cache path (compiled with the eager backend, and uncompiled) gives the dynamic
    path's greedy ids and log-probs, and keeps its savings: repeated prompts, shared heads and stored
    prefixes (same reused-token counts). Sampled ids agree too (same generator stream)."""
    from components.mas.prefill import PrefixStore

    model, tok = build_tiny_model(0)
    model.eval()
    head = list(range(5, 45))
    prompts = [head + [90, 91, 92], list(range(50, 62)), head + [90, 91, 92], head + [94, 95], list(range(100, 120))]
    dynamic = generate(model, tok, prompts, 6, min_new=6)
    assert dynamic.reused_tokens > 0  # the shared head (the repeated row is deduplicated as well)
    _same(_static(model, tok, prompts, 6, backend="eager"), dynamic)
    _same(_static(model, tok, prompts, 6), dynamic)
    sampled = Decoder(model, StopIds(int(tok.eos_token_id), int(tok.pad_token_id))).generate(
        prompts, Sampling(6, min_new_tokens=6), torch.Generator().manual_seed(3), PrefixPlan())
    _same(_static(model, tok, prompts, 6, seed=3), sampled)
    # stored frame prefixes (a later round): the static path reads and writes the store alike
    lens = [len(head), 0, len(head), len(head), 0]
    stores = PrefixStore(), PrefixStore()
    generate(model, tok, prompts, 6, min_new=6, lens=lens, store=stores[0])
    _static(model, tok, prompts, 6, lens=lens, store=stores[1])
    assert stores[0].entries.keys() == stores[1].entries.keys() == {tuple(head)}
    later = [head + [7, 7, 7, 90], head + [8, 94]]
    reused = generate(model, tok, later, 6, min_new=6, lens=[len(head)] * 2, store=stores[0])
    assert reused.reused_tokens == 2 * len(head)
    _same(_static(model, tok, later, 6, backend="eager", lens=[len(head)] * 2, store=stores[1]), reused)


def test_static_cache_rollout_equals_the_dynamic_rollout_on_cpu():
    """``mas.static_cache=true`` on CPU decodes on the static cache (uncompiled) and plays the same
    2-round episodes, reusing the same prefix tokens."""
    from components.config import MasConfig
    from components.data.item import Item
    from components.mas.engine import RolloutEngine

    model, tok = build_tiny_model(0)
    items = [Item(id=f"t/{i}", benchmark="gsm8k", question=f"What is {i} + 3?", answer=str(i + 3),
                  answer_type="numeric") for i in range(2)]
    runs = []
    for static in (False, True):
        eng = RolloutEngine(model, tok, MasConfig(agents=2, rounds=2, max_message_tokens=6, static_cache=static))
        assert eng.decoder.static_cache is static
        eps = eng.rollout(items, 2, seed=4)
        runs.append(([(m.completion_ids, m.logprobs) for ep in eps for m in ep.messages],
                     eng.last_stats.prefix_tokens_reused))
    assert runs[0][1] > 0 and runs[0][1] == runs[1][1]
    for (ids_a, lps_a), (ids_b, lps_b) in zip(runs[0][0], runs[1][0], strict=True):
        assert ids_a == ids_b
        torch.testing.assert_close(torch.tensor(lps_a), torch.tensor(lps_b), atol=1e-5, rtol=0)


def test_decode_makes_one_host_sync_per_token(monkeypatch):
    """With the 4-D mask (CPU, static cache) only the stop check reads the device per generated
    token (plus a few transfers per call): nothing in the loop, transformers' mask building
    included, calls ``bool``/``item``/``tolist``/``cpu`` on a tensor per step; with the 2-D mask at
    most one more per step. Counted by wrapping those Tensor methods."""
    model, tok = build_tiny_model(0)
    model.eval()
    prompts = [list(range(5, 40)), list(range(50, 62)), list(range(5, 40)), list(range(70, 90))]
    counts = count_host_reads(monkeypatch)
    for static in (False, True):
        decoder = Decoder(model, StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3),
                          options=DecodeOptions(static_cache=static))
        counts["n"] = 0
        gen = decoder.generate(prompts, Sampling(24, min_new_tokens=24), torch.Generator().manual_seed(0),
                               PrefixPlan())
        assert gen.steps == 24
        assert counts["n"] <= gen.steps + 8, (static, counts["n"])
    # the 2-D mask (the dynamic cache on CUDA): transformers' mask builder adds its own check per step
    # (measured: 55 for 24 steps), which on the H200 still decoded as fast as model.generate
    decoder = Decoder(model, StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3))
    decoder.mask_4d, counts["n"] = False, 0
    gen = decoder.generate(prompts, Sampling(24, min_new_tokens=24), torch.Generator().manual_seed(0), PrefixPlan())
    assert gen.steps + 8 < counts["n"] <= 2 * gen.steps + 8


def test_the_two_padding_masks_decode_alike_and_each_device_gets_its_faster_one():
    """The 4-D boolean mask (CPU, static cache) and transformers' 2-D mask (dynamic cache on CUDA)
    give the same ids and log-probs on padded rows with shared heads, greedy and sampled; which one a
    decoder passes follows bench/decode_step.py's measurements (see Decoder's docstring)."""
    model, tok = build_tiny_model(0)
    model.eval()
    stops = StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3)
    head = list(range(5, 45))
    prompts = [head + [90, 91, 92], list(range(50, 62)), head + [94, 95], list(range(100, 120)), [7, 8]]
    for sampling, seed in ((Sampling(8, greedy=True, min_new_tokens=8), None), (Sampling(8, temperature=0.9), 5)):
        runs = []
        for mask_4d in (True, False):
            decoder = Decoder(model, stops)
            decoder.mask_4d = mask_4d
            gen = None if seed is None else torch.Generator().manual_seed(seed)
            runs.append(decoder.generate(prompts, sampling, gen, PrefixPlan()))
        assert runs[0].reused_tokens > 0
        _same(runs[0], runs[1])
    assert Decoder(model, stops).mask_4d is True  # CPU: the same speed; the committed results' mask
    assert Decoder(model, stops, device="cuda").mask_4d is False  # H200: 24.4 vs 33.5 ms (no CUDA needed to build)
    static = DecodeOptions(static_cache=True)
    assert Decoder(model, stops, device="cuda", options=static).mask_4d is True  # what the compiled step ran
