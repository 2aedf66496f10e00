"""The adaptive protocol (silence retires an agent, nothing new = no call, early end), the answer rule,
turn order, accounting with skipped calls, and silence as one explorable token (prior, masking,
exact ratios). Replies are scripted per agent so every rule is checked on known transcripts."""

from __future__ import annotations

import pytest
import torch

from components.config import MasConfig
from components.data.item import Item
from components.gspo.batching import pack_messages
from components.gspo.logprobs import Sampling, completion_logprobs
from components.mas.decode import Generation
from components.mas.engine import RolloutEngine, fact_holder
from components.mas.environment import Environment
from components.models.silence import (
    SilenceTokenError,
    ensure_silence_token,
    first_token_states,
    set_silence_prior,
    silence_probability,
)
from components.models.tiny import build_tiny_model

ITEM = Item(id="t/0", benchmark="gsm8k", question="What is 2 + 3?", answer="5", answer_type="numeric")


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_tiny_model(seed=0)
    torch.set_num_threads(threads)


class Script:
    """Stands in for the decoder: agent k's reply in round r is ``replies[(k, r)]`` (text or SILENT)."""

    SILENT = object()

    class Cut(str):
        """A reply the message cap cut: its ids end without EOS."""

    def __init__(self, engine: RolloutEngine, replies: dict) -> None:
        self.engine, self.replies, self.calls = engine, replies, []
        self.real = engine.decoder

    def _agent(self, prompt: list[int]) -> int:
        text = self.engine.tok.decode(prompt)
        return next(k for k in range(8) if f"agent {k + 1} of" in text)

    def generate(self, prompts, sampling, generator=None, plan=None, no_silence=None) -> Generation:
        agents = [self._agent(p) for p in prompts]
        self.calls.append(sorted(agents))
        ids = []
        for a in agents:
            r = sum(a in c for c in self.calls) - 1  # this agent's r-th turn
            reply = self.replies.get((a, r), Script.SILENT)
            tok = self.engine.tok
            cut = isinstance(reply, Script.Cut)  # generated up to the cap, no EOS
            ids.append([self.engine.silence_id] if reply is Script.SILENT
                       else tok.encode(str(reply), add_special_tokens=False) + ([] if cut else [tok.eos_token_id]))
        return Generation(ids, [[0.0] * len(x) for x in ids], max(map(len, ids)), 0, [0.1] * len(ids))


def play(tiny, replies: dict, **cfg) -> tuple[list, Script]:
    engine = RolloutEngine(*tiny, MasConfig(**{"agents": 3, "rounds": 2, "context_tokens": 4096, **cfg}))
    script = Script(engine, replies)
    engine.decoder = script  # type: ignore[assignment]
    return Environment(engine).play([ITEM], 1, seed=0), script


def test_silent_agents_are_retired_and_the_latest_answers_vote(tiny):
    eps, script = play(tiny, {(0, 0): "The answer is 7", (1, 0): "The answer is 5", (2, 0): Script.SILENT,
                              (0, 1): Script.SILENT, (1, 1): "The answer is 5"})
    ep = eps[0]
    assert script.calls == [[0, 1, 2], [0, 1]]  # agent 3 was silent: never prompted again
    assert [(m.agent_id, m.round, m.silent) for m in ep.messages] == [
        (0, 0, False), (1, 0, False), (2, 0, True), (0, 1, True), (1, 1, False)]
    assert ep.calls_skipped == 1 and ep.turns == 3
    # agent 1's latest answer (7, round 1 silent = abstention) vs agent 2's 5: a tie -> earliest agent
    assert ep.final_answer == "The answer is 7" and not ep.correct
    assert ep.prompt_tokens == sum(len(m.prompt_ids) for m in ep.messages)  # skipped turns cost nothing


def test_nothing_new_means_no_call_and_the_episode_ends(tiny):
    eps, script = play(tiny, {(0, 0): "The answer is 5"}, rounds=3)
    ep = eps[0]
    assert script.calls == [[0, 1, 2]]  # agent 1 read nothing new; agents 2 and 3 retired
    assert len(ep.messages) == 3 and ep.calls_skipped == 9 - 3
    assert ep.final_answer == "The answer is 5" and ep.correct
    assert ep.messages[0].recipients == []  # nobody read it: the silent agents were never prompted again


def test_a_prompt_the_context_budget_left_unchanged_is_not_asked_again(tiny):
    """Round 0's messages are too long for mas.context_tokens: nobody's round-1 prompt would differ
    from the one it answered. Was: every agent was prompted again with the identical prompt in every
    round (whole calls charged to the policy), and calls_skipped stayed 0."""
    long = "The answer is 5. " * 40
    eps, script = play(tiny, {(a, r): long for a in range(3) for r in range(3)}, rounds=3, context_tokens=64)
    ep = eps[0]
    assert script.calls == [[0, 1, 2]] and len(ep.messages) == 3 and ep.calls_skipped == 6
    assert all(m.recipients == [] for m in ep.messages)  # nothing was delivered
    eps, script = play(tiny, {(a, r): long for a in range(3) for r in range(3)}, rounds=3, context_tokens=64,
                       protocol="broadcast")
    assert script.calls == [[0, 1, 2]] * 3  # the comparison protocol still prompts everyone


def test_cap_hits_are_replies_the_cap_cut(tiny):
    """A reply that ran into mas.max_message_tokens without EOS is truncated; one whose EOS fell on the
    cap, or a silent one, is not (was: length >= cap, silent replies included)."""
    tok = tiny[1]
    ids = tok.encode("one two three four", add_special_tokens=False)
    n = len(ids)
    engine = RolloutEngine(*tiny, MasConfig(agents=3, rounds=1, max_message_tokens=n, context_tokens=4096))
    ends_on_cap = tok.decode(ids[: n - 1])  # n - 1 ids + EOS = n: the EOS is the cap's last token
    engine.decoder = Script(engine, {(0, 0): Script.Cut(tok.decode(ids)), (1, 0): ends_on_cap})  # type: ignore
    ep = Environment(engine).play([ITEM], 1, seed=0)[0]
    assert [len(m.completion_ids) for m in ep.messages[:2]] == [n, n]
    assert [m.truncated for m in ep.messages] == [True, False, False] and ep.messages[2].silent


def test_broadcast_prompts_everyone_every_round_and_votes_on_the_last_round(tiny):
    eps, script = play(tiny, {(0, 0): "The answer is 5", (1, 1): "The answer is 7"}, protocol="broadcast")
    ep = eps[0]
    assert script.calls == [[0, 1, 2], [0, 1, 2]] and ep.calls_skipped == 0
    assert ep.final_answer == "The answer is 7"  # round 1's only answer; round 0's 5 does not vote


def test_in_turn_lets_a_later_agent_read_an_earlier_answer_of_the_same_round(tiny):
    eps, script = play(tiny, {(0, 0): "The answer is 5", (1, 0): "The answer is 5"}, turn_order="in_turn",
                       rounds=1)
    ep = eps[0]
    assert script.calls == [[0], [1], [2]]
    body = tiny[1].encode("The answer is 5", add_special_tokens=False)
    later = ep.messages[1].prompt_ids
    assert any(later[i:i + len(body)] == body for i in range(len(later)))
    assert ep.messages[0].recipients == [1, 2]


def test_the_fact_holder_is_spread_over_a_group_and_fixed_per_item(tiny):
    fact = Item(id="s/1", benchmark="splitinfo", question="What is the code now?", answer="1234",
                answer_type="numeric", meta={"private": "The new code is 1234."})
    holders = [fact_holder(fact, g, 3) for g in range(6)]
    assert sorted(holders[:3]) == [0, 1, 2] and holders[:3] == holders[3:]
    assert fact_holder(ITEM, 0, 3) is None
    engine = RolloutEngine(*tiny, MasConfig(agents=3, rounds=1, max_message_tokens=4))
    ep = engine.rollout([fact], 3, seed=0)
    for g, e in enumerate(ep):
        holder = [m.agent_id for m in e.messages if m.private]
        assert holder == [fact_holder(fact, g, 3)]
        for m in e.messages:
            assert ("1234" in tiny[1].decode(m.prompt_ids)) is m.private


def test_silence_token_is_added_once_and_the_prior_is_reached(tiny):
    model, tok = build_tiny_model(seed=3)
    n = model.get_input_embeddings().weight.shape[0]
    tid = ensure_silence_token(model, tok, "<quiet>")
    assert tok.encode("<quiet>", add_special_tokens=False) == [tid] and tid == n
    assert model.get_input_embeddings().weight.shape[0] == n + 1
    assert torch.count_nonzero(model.get_output_embeddings().weight[tid]) == 0
    assert ensure_silence_token(model, tok, "<quiet>") == tid  # idempotent: a saved policy keeps its row
    engine = RolloutEngine(model, tok, MasConfig(agents=3, silence_marker="<quiet>"))
    prompts = engine.first_round_prompts([ITEM])
    assert len(prompts) == 3
    reached = set_silence_prior(model, prompts, tid, 0.05, temperature=0.8)
    assert 0.03 < reached < 0.08 and reached == pytest.approx(silence_probability(model, prompts, tid, 0.8))
    assert set_silence_prior(model, prompts, tid, 0.0) < 0.01



def _per_prompt_probs(model, prompts, tid, temperature):
    _, logits = first_token_states(model, prompts)
    return torch.softmax(logits / temperature, dim=-1)[:, tid]


def test_per_prompt_calibration_gives_every_prompt_the_prior():
    """The per-prompt (ridge) fit puts each calibration prompt near the prior (on the real model, where
    the mean-direction fit spreads them widely: tests/integration/test_models_smollm2.py)."""
    model, tok = build_tiny_model(seed=5)
    engine = RolloutEngine(model, tok, MasConfig(agents=3))
    items = [Item(id=f"t/{k}", benchmark="gsm8k", question=q, answer="1", answer_type="numeric")
             for k, q in enumerate(["What is 2 + 3?", "How many legs do 4 cats have?", "Add 10 and 15.",
                                    "A train leaves at 3 pm and arrives at 5 pm. How long is the trip?",
                                    "Name a prime above 10.", "What is half of 90?", "Is 7 odd?", "12 / 4 = ?"])]
    prompts = engine.first_round_prompts(items)
    assert len(prompts) == 24
    tid = engine.silence_id
    reached = set_silence_prior(model, prompts, tid, 0.1, temperature=0.5, method="per_prompt")
    per_prompt = _per_prompt_probs(model, prompts, tid, 0.5)
    assert reached == pytest.approx(float(per_prompt.mean()), rel=1e-4)
    assert 0.08 < float(per_prompt.min()) and float(per_prompt.max()) < 0.12
    mean_dir = set_silence_prior(model, prompts, tid, 0.1, temperature=0.5, method="mean_direction")
    assert mean_dir == pytest.approx(float(_per_prompt_probs(model, prompts, tid, 0.5).mean()), rel=1e-4)
    with pytest.raises(SilenceTokenError, match="silence_calibration"):
        set_silence_prior(model, prompts, tid, 0.1, method="median")


def test_calibration_items_sample_every_source_and_mean_direction_keeps_the_first():
    from components.mas.prior import CALIBRATION_ITEMS, CALIBRATION_SAMPLE, calibration_items

    items = [Item(id=f"{b}/{k}", benchmark=b, question=f"q{b}{k}", answer="1", answer_type="numeric")
             for b in ("gsm8k", "svamp") for k in range(100)]
    assert calibration_items(items, "mean_direction") == items[:CALIBRATION_ITEMS]
    picked = calibration_items(items, "per_prompt")
    assert len(picked) == CALIBRATION_SAMPLE and len(set(id(i) for i in picked)) == CALIBRATION_SAMPLE
    assert {i.benchmark for i in picked} == {"gsm8k", "svamp"}  # the first 32 would all be gsm8k
    assert calibration_items(items, "per_prompt") == picked  # seeded
    assert len(calibration_items(items[:5], "per_prompt")) == 5  # fewer items than the sample: all of them


def test_exploration_keeps_the_ratio_exact(tiny):
    """With a 20 % prior the policy samples silence itself; the trainer's log-probs (silence masked
    after the first token) equal the behaviour log-probs of every message, silent or not, so the
    GSPO ratio is exactly 1 before an update."""
    model, tok = build_tiny_model(seed=0)
    cfg = MasConfig(agents=3, rounds=2, max_message_tokens=8, temperature=1.0)
    engine = RolloutEngine(model, tok, cfg)
    set_silence_prior(model, engine.first_round_prompts([ITEM]), engine.silence_id, 0.2)
    eps = engine.rollout([ITEM] * 4, 4, seed=1)
    msgs = [m for e in eps for m in e.messages]
    silent = [m for m in msgs if m.silent]
    assert 0.05 * len(msgs) < len(silent) < 0.5 * len(msgs)
    assert all(m.completion_ids == [engine.silence_id] for m in silent)
    assert all(engine.silence_id not in m.completion_ids for m in msgs if not m.silent)
    batch = pack_messages(msgs, int(tok.pad_token_id))
    with torch.no_grad():
        logp = completion_logprobs(model, batch, Sampling(temperature=1.0, silence_id=engine.silence_id))
        unmasked = completion_logprobs(model, batch, Sampling(temperature=1.0))
    behaviour = torch.zeros_like(logp)
    for row, m in enumerate(msgs):
        behaviour[row, : m.completion_tokens] = torch.tensor(m.logprobs)
    assert ((logp - behaviour) * batch.completion_mask).abs().max() < 1e-4
    assert ((unmasked - behaviour) * batch.completion_mask).abs().max() > 1e-3  # the mask matters


def test_a_lone_agent_never_silent_keeps_the_ratio_exact_too():
    """mas.agents=1: the decoder masks silence at every step, the first included; the trainer's
    log-probs must renormalise there too (was: only from the 2nd token, so π_old held silence mass the
    sampler never had and the gradient moved the silence row of a team that cannot use it)."""
    from components.gspo.trainer import GSPOTrainer

    model, tok = build_tiny_model(seed=0)
    engine = RolloutEngine(model, tok, MasConfig(agents=1, rounds=1, max_message_tokens=8, temperature=1.0))
    set_silence_prior(model, engine.first_round_prompts([ITEM]), engine.silence_id, 0.3)
    assert engine.silence_first is False
    msgs = [m for e in engine.rollout([ITEM] * 4, 4, seed=1) for m in e.messages]
    assert not any(m.silent for m in msgs)
    batch = pack_messages(msgs, int(tok.pad_token_id))
    with torch.no_grad():
        logp = completion_logprobs(model, batch, Sampling(temperature=1.0, silence_id=engine.silence_id,
                                                          silence_from=0))
        team_rule = completion_logprobs(model, batch, Sampling(temperature=1.0, silence_id=engine.silence_id))
    behaviour = torch.zeros_like(logp)
    for row, m in enumerate(msgs):
        behaviour[row, : m.completion_tokens] = torch.tensor(m.logprobs)
    assert ((logp - behaviour) * batch.completion_mask).abs().max() < 1e-4
    assert ((team_rule - behaviour) * batch.completion_mask).abs().max() > 1e-2  # the first token differs
    from types import SimpleNamespace

    from components.config import load_config
    from components.runtime.distributed import DistInfo

    cfg = load_config(None, None, ["mas.agents=1"])
    trainer = GSPOTrainer(cfg, SimpleNamespace(module=model), SimpleNamespace(engine=engine), [ITEM],
                          DistInfo(0, 1, 0, True), pad_id=0)
    assert trainer.silence_from == 0  # the trainer masks where this engine's sampler did


def _force_silence(engine: RolloutEngine, *also: int):
    """A logits processor that makes silence (or one of ``also``) all but certain as a first token."""
    def bias(logits: torch.Tensor, step: int) -> torch.Tensor:
        if step == 0:
            logits[:, [engine.silence_id, *also]] += 1e4
        return logits
    return bias


def test_must_answer_keeps_agent_0_speaking_in_round_0_and_the_ratio_exact():
    """mas.must_answer: with silence forced on every reply, agent 0's round-0 reply still speaks (the
    decoder masks silence there), the others fall silent, and the episode ends with agent 0's answer.
    The trainer masks the same first token (Message.silence_allowed), so its log-probs equal the
    behaviour log-probs; scored as an ordinary team row they would not."""
    model, tok = build_tiny_model(seed=0)
    cfg = MasConfig(agents=3, rounds=2, max_message_tokens=8, temperature=1.0, must_answer=True)
    engine = RolloutEngine(model, tok, cfg)
    space = tok.encode(" ", add_special_tokens=False)[0]
    assert engine.first_banned is not None and engine.first_banned[[engine.eos, engine.silence_id, space]].all()
    assert not engine.first_banned[tok.encode("5", add_special_tokens=False)[0]]
    # silence, an empty reply (EOS first) and a whitespace start are the ways to say nothing: all forced
    engine.decoder.logits_processor = _force_silence(engine, engine.eos, space)
    eps = engine.rollout([ITEM] * 3, 2, seed=1)
    for ep in eps:
        first = ep.messages[0]
        assert (first.agent_id, first.round, first.silent, first.silence_allowed) == (0, 0, False, False)
        assert first.silence_prob == 0.0 and first.completion_ids[0] not in (engine.eos, engine.silence_id, space)
        others = [m for m in ep.messages if m.round == 0 and m.agent_id > 0]
        assert all(m.silence_allowed and m.completion_ids[0] in (engine.eos, engine.silence_id, space) for m in others)
    engine.decoder.logits_processor = _force_silence(engine)
    for ep in engine.rollout([ITEM] * 3, 2, seed=1):
        assert [(m.agent_id, m.round, m.silent, m.silence_allowed) for m in ep.messages] == [
            (0, 0, False, False), (1, 0, True, True), (2, 0, True, True)]
        assert ep.calls_skipped == 3  # round 1: agents 1, 2 retired, agent 0 has nothing new
    engine.decoder.logits_processor = None
    msgs = [m for e in engine.rollout([ITEM] * 4, 4, seed=2) for m in e.messages]
    assert any(not m.silence_allowed for m in msgs) and any(m.silence_allowed for m in msgs)
    set_silence_prior(model, engine.first_round_prompts([ITEM]), engine.silence_id, 0.5)
    with torch.no_grad():  # EOS as likely a first token as silence: masking it must show in the ratio
        model.get_output_embeddings().weight[engine.eos] = model.get_output_embeddings().weight[engine.silence_id]
    msgs = [m for e in engine.rollout([ITEM] * 4, 4, seed=3) for m in e.messages]
    assert not any(m.silent for m in msgs if not m.silence_allowed)
    batch = pack_messages(msgs, int(tok.pad_token_id))
    assert batch.no_silence is not None and batch.no_silence.tolist() == [not m.silence_allowed for m in msgs]
    team_rows = pack_messages(msgs, int(tok.pad_token_id))
    team_rows.no_silence = None
    banned = engine.first_banned
    with torch.no_grad():
        logp = completion_logprobs(model, batch, Sampling(temperature=1.0, silence_id=engine.silence_id,
                                                          first_banned=banned))
        unmasked_first = completion_logprobs(model, team_rows, Sampling(temperature=1.0, silence_id=engine.silence_id,
                                                                        first_banned=banned))
        only_silence = torch.zeros_like(banned)
        only_silence[engine.silence_id] = True
        silence_only = completion_logprobs(model, batch, Sampling(temperature=1.0, silence_id=engine.silence_id,
                                                                  first_banned=only_silence))
        picked = completion_logprobs(model, batch.select(torch.tensor([0, 3, 5])),
                                     Sampling(temperature=1.0, silence_id=engine.silence_id, first_banned=banned))
    behaviour = torch.zeros_like(logp)
    for row, m in enumerate(msgs):
        behaviour[row, : m.completion_tokens] = torch.tensor(m.logprobs)
    assert ((logp - behaviour) * batch.completion_mask).abs().max() < 1e-4
    assert ((unmasked_first - behaviour) * batch.completion_mask).abs().max() > 1e-2  # P(silence) 0.5 matters
    assert ((silence_only - behaviour) * batch.completion_mask).abs().max() > 1e-2  # so does P(EOS)
    with pytest.raises(ValueError, match="first_banned"):  # rows that had to speak, scored without the mask
        completion_logprobs(model, batch, Sampling(temperature=1.0, silence_id=engine.silence_id))
    from types import SimpleNamespace

    from components.config import load_config
    from components.gspo.trainer import GSPOTrainer
    from components.runtime.distributed import DistInfo

    trainer = GSPOTrainer(load_config(None, None, ["mas.must_answer=true"]), SimpleNamespace(module=model),
                          SimpleNamespace(engine=engine), [ITEM], DistInfo(0, 1, 0, True), pad_id=0)
    assert trainer.first_banned is banned  # the trainer masks what this engine's sampler masked
    assert (picked - logp[[0, 3, 5], : picked.shape[1]]).abs().max() < 1e-5  # select keeps the rows' masks


def test_must_answer_off_lets_the_whole_team_fall_silent_and_needs_a_team():
    from pydantic import ValidationError

    model, tok = build_tiny_model(seed=0)
    engine = RolloutEngine(model, tok, MasConfig(agents=3, rounds=2, max_message_tokens=8))
    engine.decoder.logits_processor = _force_silence(engine)
    ep = engine.rollout([ITEM], 1, seed=1)[0]
    assert all(m.silent and m.silence_allowed for m in ep.messages) and len(ep.messages) == 3
    assert pack_messages(ep.messages, 0).no_silence is None
    from components.mas.decode import Sampling

    with pytest.raises(ValueError, match="first_banned"):  # this engine built no mask to apply
        engine.decoder.generate([ep.messages[0].prompt_ids], Sampling(2), no_silence=[True])
    with pytest.raises(ValidationError, match="must_answer needs a team"):
        MasConfig(agents=1, must_answer=True)
