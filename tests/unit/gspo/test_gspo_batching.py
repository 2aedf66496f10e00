"""Packing: the mask-free, left-aligned layout scores every completion token exactly as a lone,
unpadded forward of that message does (prompts and completions of different lengths)."""

from __future__ import annotations

import torch

from components.gspo.batching import pack_messages
from components.gspo.logprobs import Sampling, completion_logprobs
from components.mas.records import Message
from components.models.tiny import build_tiny_model


def _msg(prompt: list[int], completion: list[int]) -> Message:
    return Message(question_id="q", group_index=0, agent_id=0, role="solver", round=0, prompt_ids=prompt,
                   completion_ids=completion, logprobs=[0.0] * len(completion), silent=False, recipients=[])


def _lone_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: len(prompt) + len(completion) - 1] / temperature
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_packed_logprobs_equal_unpadded_forwards():
    model, tok = build_tiny_model(0)
    model.eval()
    g = torch.Generator().manual_seed(0)
    shapes = [(5, 7), (23, 1), (12, 9), (31, 4), (2, 0)]  # (prompt, completion) lengths; one empty reply
    msgs = [_msg(torch.randint(3, 400, (p,), generator=g).tolist(), torch.randint(3, 400, (c,), generator=g).tolist())
            for p, c in shapes]
    batch = pack_messages(msgs, pad_id=int(tok.pad_token_id))
    assert batch.input_ids.shape == (5, 31 + 9)
    with torch.no_grad():
        packed = completion_logprobs(model, batch, Sampling(temperature=0.7))
        for r, m in enumerate(msgs):
            lone = _lone_logprobs(model, m.prompt_ids, m.completion_ids, 0.7)
            torch.testing.assert_close(packed[r, : len(lone)], lone, atol=1e-5, rtol=1e-5)
            assert packed[r, len(lone):].abs().sum() == 0
        # a mini-batch selection trims to its own width and scores the same
        sub = batch.select(torch.tensor([3, 0]))
        assert sub.input_ids.shape[1] == 31 + 9
        sub2 = batch.select(torch.tensor([0, 4]))
        assert sub2.input_ids.shape[1] == 5 + 9
        torch.testing.assert_close(completion_logprobs(model, sub2, Sampling(temperature=0.7)), packed[[0, 4]],
                                   atol=1e-5, rtol=1e-5)


def test_packing_rejects_an_empty_prompt():
    import pytest

    with pytest.raises(ValueError, match="empty prompt"):
        pack_messages([_msg([], [1, 2])], pad_id=0)


def test_bf16_logits_are_cast_to_float32_before_the_temperature():
    """A bf16 policy: π is log_softmax(float32(logits) / T), not a bf16 division (whose rounding,
    ~0.4 % of a logit, is of the order of the GSPO clip range), and the silence renormalisation
    matches a float32 masked softmax."""
    model, tok = build_tiny_model(0)
    model = model.to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    msgs = [_msg(torch.randint(3, 400, (p,), generator=g).tolist(), torch.randint(3, 400, (c,), generator=g).tolist())
            for p, c in [(9, 6), (14, 3), (4, 8)]]
    batch = pack_messages(msgs, pad_id=int(tok.pad_token_id))
    silence = 7
    with torch.no_grad():
        got = completion_logprobs(model, batch, Sampling(temperature=0.7, silence_id=silence))
        logits = model(input_ids=batch.input_ids).logits  # bf16 [B, W, V]
    for r, m in enumerate(msgs):
        p, c = len(m.prompt_ids), len(m.completion_ids)
        x = logits[r, p - 1: p + c - 1].float() / 0.7  # [c, V]
        x[1:, silence] = float("-inf")  # the decoder masks silence after the first token
        ref = torch.log_softmax(x, -1).gather(-1, torch.tensor(m.completion_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(got[r, :c], ref, atol=2e-6, rtol=0)
