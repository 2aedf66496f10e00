"""Batched rollout engine on a tiny random model: token accounting, silence, padding, log-probs."""

import pytest
import torch

from components.config import MasConfig
from components.data.item import Item, ItemError
from components.errors import UserError
from components.mas.calls import EngineOptions
from components.mas.decode import Decoder, Sampling, StopIds
from components.mas.engine import RolloutEngine, RolloutInputError
from components.mas.environment import Environment
from components.mas.records import Message
from components.mas.voting import majority
from components.models.tiny import SILENCE_MARKER, build_tiny_model


@pytest.fixture(scope="module")
def tiny():
    # Tiny matmuls gain nothing from intra-op threads; on a shared 2-core box they lose ~10x to contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_tiny_model(seed=0)
    torch.set_num_threads(threads)


def _items(n=2):
    return [Item(id=f"t/{i}", benchmark="gsm8k", split="test", question=f"What is {i} + 3?", answer=str(i + 3),
                 answer_type="numeric") for i in range(n)]


def _engine(tiny, **cfg_kw):
    options = EngineOptions(logits_processor=cfg_kw.pop("logits_processor", None))
    cfg = MasConfig(**{"agents": 3, "rounds": 2, "max_message_tokens": 12, **cfg_kw})
    return RolloutEngine(tiny[0], tiny[1], cfg, options=options)


def _contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_token_accounting_is_exact(tiny):
    model, tok = tiny
    eng = _engine(tiny)
    eps = eng.rollout(_items(2), 3, seed=0)
    assert len(eps) == 6 and [e.group_index for e in eps] == [0, 1, 2] * 2
    for ep in eps:
        assert len(ep.messages) == 3 * 2
        for m in ep.messages:
            assert len(m.completion_ids) == len(m.logprobs) == m.completion_tokens
            assert 1 <= m.completion_tokens <= 12
            assert tok.eos_token_id not in m.completion_ids[:-1]  # stops at the first EOS, no padding
            body = m.completion_ids[:-1] if m.completion_ids[-1] == tok.eos_token_id else m.completion_ids
            assert m.text == tok.decode(body, skip_special_tokens=False)
            # a delivered message's ids appear verbatim in each recipient's next prompt
            for r in m.recipients:
                later = next(x for x in ep.messages if x.agent_id == r and x.round > m.round)
                assert _contains(later.prompt_ids, body)
        assert ep.completion_tokens == sum(len(m.completion_ids) for m in ep.messages)
        assert ep.prompt_tokens == sum(len(m.prompt_ids) for m in ep.messages)
        assert ep.total_tokens == ep.prompt_tokens + ep.completion_tokens
        assert ep.communicated_tokens == sum(m.completion_tokens * len(m.recipients)
                                             for m in ep.messages if not m.silent)
    stats = eng.last_stats
    assert stats.calls == 2 and stats.generated_tokens == sum(e.completion_tokens for e in eps)
    assert stats.decode_steps <= 2 * 12  # cost grows with the longest message, not rows


def test_complete_topology_recipients(tiny):
    eps = _engine(tiny, context_tokens=4096).rollout(_items(1), 2, seed=1)
    for m in eps[0].messages:
        if m.silent:
            assert m.recipients == []
        elif m.round == 0:
            assert m.recipients == [j for j in range(3) if j != m.agent_id]
        else:
            assert m.recipients == []  # final round, no decision agent


def _force_silence(tok):
    marker = tok.convert_tokens_to_ids(SILENCE_MARKER)

    def proc(logits, step):
        only = marker if step == 0 else tok.eos_token_id
        out = torch.full_like(logits, float("-inf"))
        out[:, only] = 0.0
        return out
    return proc


def test_forced_silence(tiny):
    eng = _engine(tiny, logits_processor=_force_silence(tiny[1]))
    eps = Environment(eng).play(_items(2), 2, seed=0)
    for ep in eps:
        assert all(m.silent and m.recipients == [] for m in ep.messages)
        assert ep.communicated_tokens == 0 and ep.turns == 0 and ep.silence_rate == 1.0
        assert ep.completion_tokens == len(ep.messages)  # the marker still counts; the reply stops there
        r0 = {m.agent_id: m.prompt_ids for m in ep.messages if m.round == 0}
        assert all(m.prompt_ids == r0[m.agent_id] for m in ep.messages)  # nothing was delivered
        assert ep.final_answer == "" and not ep.correct


def test_silence_is_the_token_as_first_reply_or_an_empty_reply(tiny):
    _, tok = tiny
    eng = _engine(tiny)
    marker = tok.convert_tokens_to_ids(SILENCE_MARKER)
    ws = tok.encode(" \n", add_special_tokens=False)
    assert eng.silence_id == marker
    assert eng.is_silent([marker])
    assert not eng.is_silent(tok.encode("I say", add_special_tokens=False) + [marker])
    # an empty reply (only EOS / whitespace) says nothing: treated as silence, never delivered
    assert eng.is_silent([tok.eos_token_id])
    assert eng.is_silent(ws + [tok.eos_token_id])
    assert not eng.is_silent(tok.encode("ok", add_special_tokens=False) + [tok.eos_token_id])


def test_batched_equals_one_at_a_time_greedy(tiny):
    model, tok = tiny
    prompts = [tok.encode(t, add_special_tokens=False) for t in
               ["What is 2 + 3?", "The answer is 42 and the critic agrees with the verifier", "hi",
                "<|im_start|>user\nLet us solve the problem step by step.<|im_end|>\n<|im_start|>assistant\n"]]
    decoder, sampling = Decoder(model, StopIds(tok.eos_token_id, tok.pad_token_id)), Sampling(10, greedy=True)
    batched = decoder.generate(prompts, sampling)
    for p, ids, lps in zip(prompts, batched.ids, batched.logprobs, strict=True):
        one = decoder.generate([p], sampling)
        assert one.ids[0] == ids
        assert max(abs(a - b) for a, b in zip(one.logprobs[0], lps, strict=True)) < 1e-4


def test_logprobs_match_recomputed_sequence(tiny):
    """Behaviour log-probs are the model's, with the silence token masked after the first position."""
    model, _ = tiny
    eng = _engine(tiny, temperature=1.0, top_p=1.0)
    eps = eng.rollout(_items(1), 2, seed=3)
    for m in eps[0].messages + eps[1].messages:
        seq = torch.tensor([m.prompt_ids + m.completion_ids])
        start = len(m.prompt_ids) - 1
        with torch.no_grad():
            logits = model(seq).logits[0].float()
        logits[start + 1:, eng.silence_id] = float("-inf")  # only a reply's first token may be silence
        logp = torch.log_softmax(logits, -1)
        assert m.silence_prob == pytest.approx(logp[start, eng.silence_id].exp().item(), abs=1e-5)
        ref = [logp[start + k, t].item() for k, t in enumerate(m.completion_ids)]
        assert all(torch.isfinite(torch.tensor(m.logprobs)))
        assert max(abs(a - b) for a, b in zip(ref, m.logprobs, strict=True)) < 1e-4


def test_seed_determinism(tiny):
    eng = _engine(tiny)
    a = eng.rollout(_items(2), 2, seed=7)
    b = eng.rollout(_items(2), 2, seed=7)
    c = eng.rollout(_items(2), 2, seed=8)
    ids = lambda eps: [m.completion_ids for e in eps for m in e.messages]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert [m.prompt_ids for e in a for m in e.messages] == [m.prompt_ids for e in b for m in e.messages]


def test_context_budget_truncates_oldest_and_limits_delivery(tiny):
    eng = _engine(tiny, agents=4, rounds=3, topology="debate", context_tokens=64, max_message_tokens=10)
    eps = eng.rollout(_items(1), 1, seed=2)
    ep = eps[0]
    for m in ep.messages:
        # every prompt holds at most 64 tokens of message blocks: prompt - frame <= budget + intro
        frame = next(x for x in ep.messages if x.agent_id == m.agent_id and x.round == 0).prompt_tokens
        assert m.prompt_tokens - frame <= 64 + len(eng.builder.intro) + len(eng.builder.outro)
    round0 = [m for m in ep.messages if m.round == 0 and not m.silent]
    full = _engine(tiny, agents=4, rounds=3, topology="debate", context_tokens=4096, max_message_tokens=10)
    ep_full = full.rollout(_items(1), 1, seed=2)[0]
    assert ep_full.messages[0].completion_ids == ep.messages[0].completion_ids  # same round-0 samples
    assert sum(len(m.recipients) for m in round0) < sum(
        len(m.recipients) for m in ep_full.messages if m.round == 0 and not m.silent)
    again = eng.rollout(_items(1), 1, seed=2)[0]
    assert [m.prompt_ids for m in again.messages] == [m.prompt_ids for m in ep.messages]


def test_chain_waves_see_same_round_predecessor(tiny):
    eng = _engine(tiny, topology="chain", rounds=1, logits_processor=None, context_tokens=4096)
    ep = eng.rollout(_items(1), 1, seed=0)[0]
    assert eng.last_stats.calls == 3
    m0, m1, m2 = ep.messages
    assert m0.recipients == ([] if m0.silent else [1]) and m2.recipients == []
    if not m0.silent:
        assert _contains(m1.prompt_ids, m0.completion_ids[:-1] if m0.completion_ids[-1] == tiny[1].eos_token_id
                         else m0.completion_ids)


def test_decision_agent_reads_last_round(tiny):
    eng = _engine(tiny, aggregation="decision_agent", context_tokens=4096)
    ep = eng.rollout(_items(1), 1, seed=0)[0]
    decider = ep.messages[-1]
    assert decider.agent_id == 3 and decider.role == "decider" and decider.round == 2
    for m in ep.messages[:-1]:
        if not m.silent and m.round == 1:
            assert m.recipients == [3]
    final = Environment(eng).play(_items(1), 1, seed=0)[0].final_answer
    if not decider.silent and decider.text.strip():
        assert final == decider.text


def test_majority_vote_tie_goes_to_earliest_agent():
    msgs = [Message("t/0", 0, agent, "r", 0, [], [1], [0.0], False, [], text)
            for agent, text in [(0, "no idea"), (1, "7 because"), (2, "it is 5")]]
    assert majority(_items(1)[0], msgs) == ("7 because", "7")  # 7 vs 5 tie; agent 0 gave no answer -> agent 1
    msgs[0].text = "5 too"
    assert majority(_items(1)[0], msgs) == ("5 too", "5")


def test_bad_items_raise_user_errors(tiny):
    eng = _engine(tiny)
    with pytest.raises(ItemError, match=r"items\[0\] .*lacks key\(s\) \['answer_type'\]"):
        eng.rollout([{"id": "x", "benchmark": "b", "question": "q", "answer": "1"}], 1, seed=0)
    with pytest.raises(UserError, match="answer_type 'essay'"):
        eng.rollout([{**_items(1)[0].to_record(), "answer_type": "essay"}], 1, seed=0)
    with pytest.raises(RolloutInputError, match="group_size"):
        eng.rollout(_items(1), 0, seed=0)


def test_environment_grades_with_the_one_grader_in_one_batch(tiny, monkeypatch):
    """play() = rollout -> vote -> ONE grade_many call over every episode (the same grader as evaluation)."""
    import components.scoring.grader as grader
    from components.scoring.result import ScoreResult

    calls = []

    def fake_grade_many(pairs, **kw):
        calls.append(list(pairs))
        return [ScoreResult(True, "9", None) for _ in pairs]

    monkeypatch.setattr(grader, "grade_many", fake_grade_many)
    eng = RolloutEngine(tiny[0], tiny[1], MasConfig(agents=2, rounds=1, max_message_tokens=6))
    eps = Environment(eng).play(_items(2), 2, seed=0)
    assert len(calls) == 1 and len(calls[0]) == 4
    assert [item.id for item, _ in calls[0]] == ["t/0", "t/0", "t/1", "t/1"]
    assert [text for _, text in calls[0]] == [e.final_answer for e in eps]
    assert all(e.correct and e.extracted == "9" for e in eps)


def test_static_cache_on_cpu_decodes_on_the_static_cache_uncompiled(tiny):
    """mas.static_cache on CPU: the static KV cache (same ids, see test_mas_decode), no torch.compile."""
    eng = _engine(tiny, static_cache=True)
    assert eng.decoder.static_cache is True and eng.decoder.step_fn is tiny[0]


def test_length_buckets_split_at_twice_the_shortest_and_never_on_cuda(tiny):
    """Buckets split a call at a 2x prompt-length ratio once they hold 8 rows (CPU: padding costs
    arithmetic); on CUDA (host-bound decode steps) a call is one bucket. Both decode the same
    greedy episodes; one bucket takes the decode steps of its longest message only."""
    import math

    from components.mas.engine import length_buckets

    lengths = [10] * 8 + [25] * 8 + [12, 19]
    assert length_buckets(lengths) == [[*range(8), 16, 17], list(range(8, 16))]
    assert length_buckets([10, 50, 30]) == [[0, 2, 1]]  # fewer than min_rows: one bucket
    assert length_buckets(lengths, max_ratio=math.inf) == [[*range(8), 16, 17, *range(8, 16)]]
    model, tok = tiny
    cfg = MasConfig(agents=1, rounds=1, max_message_tokens=6)
    assert RolloutEngine(model, tok, cfg).bucket_ratio == 2.0
    assert RolloutEngine(model, tok, cfg, device="cuda").bucket_ratio == math.inf  # builds without a GPU
    short = [Item(id=f"s/{i}", benchmark="gsm8k", split="test", question=f"{i}+1?", answer="1",
                  answer_type="numeric") for i in range(4)]
    long = [Item(id=f"l/{i}", benchmark="gsm8k", split="test", answer="1", answer_type="numeric",
                 question=" ".join(["Tom has many apples and pears in a very large basket."] * 12) + f" {i}?")
            for i in range(4)]
    runs = []
    for ratio in (2.0, math.inf):
        engine = RolloutEngine(model, tok, cfg, options=EngineOptions(min_new_tokens=6))
        engine.bucket_ratio = ratio
        episodes = engine.rollout(short + long, 2, seed=0, greedy=True)
        runs.append(([(m.completion_ids, m.logprobs) for ep in episodes for m in ep.messages],
                     engine.last_stats.decode_steps))
    assert runs[0][1] == 12 and runs[1][1] == 6  # two buckets of 8 rows, then one of 16
    for (ids_a, lps_a), (ids_b, lps_b) in zip(runs[0][0], runs[1][0], strict=True):
        assert ids_a == ids_b
        torch.testing.assert_close(torch.tensor(lps_a), torch.tensor(lps_b), atol=1e-5, rtol=0)


def test_no_function_of_the_mas_package_takes_more_than_six_parameters():
    """Long parameter lists went into the config section they shadow or a small frozen context
    (EngineOptions, DecodeOptions, CallContext, BaselineRun); ``self`` and ``**kw`` not counted."""
    import ast
    from pathlib import Path

    import components.mas

    long = []
    for path in sorted(Path(components.mas.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                if len(names) > 6:
                    long.append(f"{path.name}:{node.name} ({len(names)})")
    assert long == []
