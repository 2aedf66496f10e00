"""Tiny random causal LM + byte-level BPE tokenizer for tests and CPU benchmarks.

Why not a hub model: tests must run offline, in well under a second, and deterministically.
The tokenizer is trained in-process with the ``tokenizers`` library on a small built-in corpus
(a few milliseconds), so nothing is downloaded or cached. The model is a randomly initialised
``LlamaForCausalLM`` (or ``Qwen2ForCausalLM``) — its text is gibberish, but shapes, chat template,
special tokens (ChatML, the ``<silent>`` marker) and padding behave like the real policy's.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from components.errors import UserError

SILENCE_MARKER = "<silent>"
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END, SILENCE_MARKER]

# ChatML, as used by SmolLM2-Instruct and Qwen2: the tiny model formats prompts like the real one.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS_LINES = [
    "The answer is 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 1000 3.5 -7 1/2",
    "Let us solve the problem step by step. First add, then subtract, multiply and divide.",
    "plus minus times divided by equals sum difference product quotient total each per half",
    "How many apples does she have left? He buys 3 pens at $2 each, so 3 * 2 = 6.",
    "The answer is (A) (B) (C) (D) (E). Options: A) B) C) D) E)",
    "system user assistant solver critic verifier summariser agent round message",
    "You are agent 1 of 3. Reply exactly <silent> when you have nothing useful to add.",
    "I agree with the solver. The critic found an error. The verifier checks the result.",
    "def solution(x):\n    return x + 1\n```python\nprint(solution(2))\n```",
    "Question: What is 2 + 3? Answer: 5. Therefore the final answer is 5.",
]


@lru_cache(maxsize=4)
def _train_tokenizer_json(vocab_size: int) -> str:
    """Train the byte-level BPE once per process (deterministic: same corpus, same merges)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS_LINES * 4, trainer=trainer)
    return tok.to_str()


def build_tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """ChatML tokenizer: eos = ``<|im_end|>``, pad = ``<|endoftext|>``, left padding, ``<silent>`` special."""
    tok = Tokenizer.from_str(_train_tokenizer_json(vocab_size))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, bos_token=None, unk_token=None,
        additional_special_tokens=[IM_START, SILENCE_MARKER], padding_side="left",
        model_max_length=2048)
    hf.chat_template = CHATML_TEMPLATE
    return hf


def build_tiny_model(seed: int = 0, arch: str = "llama") -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A 2-layer, hidden-64, 4-head random causal LM in fp32 (eval mode) and its tokenizer.

    ``arch``: "llama" (LlamaForCausalLM) or "qwen2" (Qwen2ForCausalLM). The same seed gives the
    same weights (the global torch RNG is saved and restored around initialisation).
    """
    tokenizer = build_tiny_tokenizer()
    common = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        tie_word_embeddings=False, dtype=torch.float32)
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    else:
        raise UserError(f"build_tiny_model: unknown arch {arch!r} (allowed: llama, qwen2)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model.eval(), tokenizer
