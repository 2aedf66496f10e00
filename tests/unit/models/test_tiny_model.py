"""Tiny random model + in-process BPE tokenizer: deterministic, fast, ChatML-shaped."""

import time

import pytest
import torch

from components.errors import UserError
from components.models.tiny import SILENCE_MARKER, build_tiny_model


def test_same_seed_same_weights_and_other_seed_differs():
    a, _ = build_tiny_model(seed=3)
    b, _ = build_tiny_model(seed=3)
    c, _ = build_tiny_model(seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_build_is_fast_and_leaves_global_rng_alone():
    build_tiny_model(seed=0)  # first call trains the tokenizer (cached afterwards)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    t0 = time.perf_counter()
    build_tiny_model(seed=1)
    assert time.perf_counter() - t0 < 1.0
    assert torch.equal(torch.rand(3), expected)


def test_tokenizer_specials_template_and_padding():
    model, tok = build_tiny_model()
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert model.config.vocab_size == len(tok)
    assert len(tok.encode(SILENCE_MARKER, add_special_tokens=False)) == 1
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # byte-level BPE round-trips
    batch = tok(["The answer is 5", "hi"], padding=True, return_tensors="pt")
    assert batch["attention_mask"][1, 0] == 0 and batch["attention_mask"][1, -1] == 1


def test_qwen2_arch_and_unknown_arch():
    model, tok = build_tiny_model(arch="qwen2")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    out = model(torch.tensor([tok.encode("The answer is 4")]))
    assert out.logits.shape[-1] == len(tok) and torch.isfinite(out.logits).all()
    with pytest.raises(UserError, match="unknown arch 'gpt9'"):
        build_tiny_model(arch="gpt9")
