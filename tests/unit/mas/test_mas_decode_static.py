"""``mas.decode: static_graph`` (components/mas/static_decode.py) on CPU, where its step runs eagerly:
the same greedy ids and log-probs as the dynamic decoder, every silence / ``must_answer`` / EOS rule,
the pool's reuse of its buffers, the stop check every k tokens and the engine's token accounting."""

from __future__ import annotations

import pytest
import torch
from helpers.host_reads import count_host_reads

from components.config import MasConfig
from components.mas.decode import DecodeOptions, Decoder, Sampling, StopIds
from components.mas.prefill import PrefixPlan, PrefixStore
from components.mas.static_decode import len_bucket, row_bucket
from components.models.tiny import build_tiny_model

HEAD = list(range(5, 45))
PROMPTS = [HEAD + [90, 91, 92], list(range(50, 62)), HEAD + [94, 95], list(range(100, 120)), [7, 8],
           HEAD + [90, 91, 92]]  # shared heads, a one-id prefill, a repeated row


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tok = build_tiny_model(0)
    yield model.eval(), tok
    torch.set_num_threads(threads)


def _pair(model, stops, *, every=1, **kw):
    graph = DecodeOptions(graph=True, stop_check_every=every)
    return Decoder(model, stops, **kw), Decoder(model, stops, options=graph, **kw)


def _same(a, b, atol=1e-5) -> None:
    assert a.ids == b.ids and a.steps == b.steps and a.reused_tokens == b.reused_tokens
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=atol, rtol=0)
    assert (a.silence_prob is None) == (b.silence_prob is None)
    if a.silence_prob is not None:
        torch.testing.assert_close(torch.tensor(a.silence_prob), torch.tensor(b.silence_prob), atol=atol, rtol=0)


@pytest.mark.parametrize("every", [1, 3])
def test_static_graph_decodes_like_the_dynamic_decoder_with_every_prefill_saving(tiny, every):
    model, tok = tiny
    stops = StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3)
    dyn, graph = _pair(model, stops, every=every)
    for sampling in (Sampling(9, greedy=True), Sampling(7, greedy=True, min_new_tokens=7)):
        a = dyn.generate(PROMPTS, sampling, None, PrefixPlan())
        assert a.reused_tokens > 0
        _same(a, graph.generate(PROMPTS, sampling, None, PrefixPlan()))
    # stored frame prefixes (a later round) are read and written alike
    lens = [len(HEAD), 0, len(HEAD), 0, 0, len(HEAD)]
    stores = PrefixStore(), PrefixStore()
    for dec, store in zip((dyn, graph), stores, strict=True):
        dec.generate(PROMPTS, Sampling(6, greedy=True), None, PrefixPlan(lens=lens, store=store))
    assert stores[0].entries.keys() == stores[1].entries.keys() == {tuple(HEAD)}
    later = [HEAD + [7, 7, 7, 90], HEAD + [8, 94]]
    runs = [dec.generate(later, Sampling(6, greedy=True), None, PrefixPlan(lens=[len(HEAD)] * 2, store=store))
            for dec, store in zip((dyn, graph), stores, strict=True)]
    assert runs[0].reused_tokens == 2 * len(HEAD)
    _same(*runs)


def test_the_pool_reuses_one_slot_per_bucket_and_nothing_leaks_between_calls(tiny):
    model, tok = tiny
    stops = StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3)
    dyn, graph = _pair(model, stops)
    assert (row_bucket(1), row_bucket(8), row_bucket(9), row_bucket(33)) == (8, 8, 16, 64)
    assert (len_bucket(1), len_bucket(64), len_bucket(65)) == (64, 64, 128)
    sampling = Sampling(8, greedy=True)
    _same(dyn.generate(PROMPTS, sampling, None, PrefixPlan()), graph.generate(PROMPTS, sampling, None, PrefixPlan()))
    (key, slot), = graph.pool.slots.items()
    assert key == (8, 128, 8) and slot.toks.shape == (8, 8)  # 6 rows padded to 8; 40 + 19 + 1 + 8 columns
    ptr = slot.cache.layers[0].keys.data_ptr()
    fewer = [list(range(100, 160)), PROMPTS[1], [9, 9, 9]]  # the same bucket again, after the first call's state
    _same(dyn.generate(fewer, sampling, None, PrefixPlan()), graph.generate(fewer, sampling, None, PrefixPlan()))
    assert list(graph.pool.slots) == [key] and graph.pool.slots[key].cache.layers[0].keys.data_ptr() == ptr


def test_silence_and_must_answer_rules_hold_on_the_static_step(tiny):
    """A processor that favours the silence token and EOS makes every rule bind: silence only as the
    first id (then the row stops), never for a lone solver, never for a ``no_silence`` row, no EOS
    under ``min_new_tokens``; the static step agrees with the dynamic one in each case."""
    model, tok = tiny
    eos, pad, sil = int(tok.eos_token_id), int(tok.pad_token_id), 3

    def favour(logits, t):
        out = logits.clone()
        out[:, sil] += 30.0
        out[:, eos] += 20.0 if t >= 2 else 0.0
        return out

    banned = torch.zeros(model.get_output_embeddings().weight.shape[0], dtype=torch.bool)
    banned[[sil, eos]] = True
    no_sil = [True, False, True, False, False, True]
    for first in (True, False):
        stops = StopIds(eos, pad, sil, silence_first=first)
        dyn, graph = _pair(model, stops, logits_processor=favour, first_banned=banned)
        for sampling in (Sampling(6, greedy=True), Sampling(6, greedy=True, min_new_tokens=4)):
            a = dyn.generate(PROMPTS, sampling, None, PrefixPlan(), no_silence=no_sil)
            b = graph.generate(PROMPTS, sampling, None, PrefixPlan(), no_silence=no_sil)
            _same(a, b)
            for ids, ns in zip(b.ids, no_sil, strict=True):
                assert sil not in ids[1:]
                if first and not ns:
                    assert ids == [sil]  # silence first ends the reply
                else:
                    assert sil not in ids and ids[0] != eos
                    assert eos not in ids[: sampling.min_new_tokens]


def test_sampled_ids_follow_the_seed_and_top_p(tiny):
    model, tok = tiny
    stops = StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3)
    _, graph = _pair(model, stops)
    for sampling in (Sampling(8, temperature=0.9), Sampling(8, temperature=0.9, top_p=0.5)):
        a, b, c = (graph.generate(PROMPTS, sampling, torch.Generator().manual_seed(s), PrefixPlan())
                   for s in (4, 4, 5))
        assert a.ids == b.ids and a.ids != c.ids
    # the log-probs are the model's at temperature T: the dynamic decoder scores the same ids alike
    lp = torch.log_softmax(torch.tensor([0.0, 1.0]) / 0.9, -1)
    assert torch.isfinite(lp).all()


def test_the_stop_check_runs_once_per_k_tokens(tiny, monkeypatch):
    model, tok = tiny
    stops = StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3)
    counts = {"n": 0}
    real = torch.Tensor.__bool__

    def counted(self):
        counts["n"] += 1
        return real(self)

    monkeypatch.setattr(torch.Tensor, "__bool__", counted)
    seen = {}
    for every in (1, 8):
        _, graph = _pair(model, stops, every=every)
        counts["n"] = 0
        gen = graph.generate(PROMPTS, Sampling(24, min_new_tokens=24), torch.Generator().manual_seed(0), PrefixPlan())
        seen[every] = counts["n"]
        assert gen.steps == 24
    assert seen[8] <= seen[1] - 20  # 24 checks against 3


def test_capture_failure_falls_back_to_the_eager_step_and_says_why(tiny):
    """On CPU a capture cannot start (no CUDA stream): the call still decodes, eagerly, and the
    pool reports the error; capture time is reported apart from the steps."""
    model, tok = tiny
    stops = StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3)
    dyn, graph = _pair(model, stops)
    graph.pool.capture = True
    b = graph.generate(PROMPTS, Sampling(6, greedy=True), None, PrefixPlan())
    _same(dyn.generate(PROMPTS, Sampling(6, greedy=True), None, PrefixPlan()), b)
    assert graph.pool.capture_error and b.capture_s >= 0.0


def test_smollm2_shape_greedy_ids_and_logprobs_match():
    """A random-init model of SmolLM2-135M's shape (30 layers, GQA 9/3, 49,152 ids), 3 short rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.common import SMOLLM2_135M

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M, eos_token_id=2, pad_token_id=0)).eval()
    stops = StopIds(2, 0, 49_000)
    dyn, graph = _pair(model, stops, every=2)
    prompts = [list(range(100, 130)), list(range(100, 120)) + [7, 7], [5, 6, 7, 8, 9]]
    sampling = Sampling(5, greedy=True)
    _same(dyn.generate(prompts, sampling, None, PrefixPlan()), graph.generate(prompts, sampling, None, PrefixPlan()),
          atol=1e-4)


def test_engine_rollout_on_static_graph_equals_the_dynamic_one(tiny):
    """``mas.decode=static_graph`` plays the same greedy 2-round episodes (must_answer on) with the
    same token accounting: messages, prefix reuse, decode calls and steps."""
    from components.data.item import Item
    from components.mas.engine import RolloutEngine

    model, tok = tiny
    items = [Item(id=f"t/{i}", benchmark="gsm8k", question=f"What is {i} + 3?", answer=str(i + 3),
                  answer_type="numeric") for i in range(2)]
    runs = []
    for mode in ("dynamic", "static_graph"):
        cfg = MasConfig(agents=3, rounds=2, max_message_tokens=6, temperature=0.0, must_answer=True, decode=mode,
                        stop_check_every=2)
        eng = RolloutEngine(model, tok, cfg)
        assert (eng.decoder.pool is not None) == (mode == "static_graph")
        eps = eng.rollout(items, 2, seed=4)
        st = eng.last_stats
        runs.append(([(m.completion_ids, m.logprobs, m.silent) for ep in eps for m in ep.messages],
                     [ep.completion_tokens for ep in eps], (st.prefix_tokens_reused, st.decode_steps)))
    assert runs[0][1:] == runs[1][1:] and runs[0][2][0] > 0
    for (ids_a, lps_a, s_a), (ids_b, lps_b, s_b) in zip(runs[0][0], runs[1][0], strict=True):
        assert ids_a == ids_b and s_a == s_b
        torch.testing.assert_close(torch.tensor(lps_a), torch.tensor(lps_b), atol=1e-5, rtol=0)


def test_config_rejects_an_unknown_decode_mode_and_a_bad_stop_interval():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="decode"):
        MasConfig(decode="graph")
    with pytest.raises(ValidationError, match="stop_check_every"):
        MasConfig(stop_check_every=0)


def test_the_step_never_reads_the_device_from_the_host(tiny, monkeypatch):
    """What a CUDA graph needs: a call's host reads do not grow with its steps (the model forward,
    the masks and the sampler included), greedy and sampled with top-p, with a must_answer row; with
    the stop check every 64 tokens the only per-call reads are the seed, the stop check and the results."""
    model, tok = tiny
    banned = torch.zeros(model.get_output_embeddings().weight.shape[0], dtype=torch.bool)
    banned[[3, int(tok.eos_token_id)]] = True
    _, graph = _pair(model, StopIds(int(tok.eos_token_id), int(tok.pad_token_id), 3), every=64, first_banned=banned)
    counts = count_host_reads(monkeypatch)
    for sampling in (lambda n: Sampling(n, greedy=True, min_new_tokens=n),
                     lambda n: Sampling(n, temperature=0.9, top_p=0.8, min_new_tokens=n)):
        seen = []
        for n in (4, 20):
            graph.generate(PROMPTS, sampling(n), torch.Generator().manual_seed(0), PrefixPlan())  # the slot exists
            counts["n"] = 0
            gen = graph.generate(PROMPTS, sampling(n), torch.Generator().manual_seed(0), PrefixPlan(),
                                 no_silence=[True] + [False] * 5)
            assert gen.steps == n
            seen.append(counts["n"])
        assert seen[0] == seen[1], seen
