"""Prompt assembly in token ids: task + delivered messages, under a context budget.

Why ids and not text: token ids end to end (docs/architecture.md). A receiver sees exactly the ids the
sender generated (its completion without EOS), framed by a short header; nothing is decoded and
re-tokenised, so token counts and the trainer's recomputed log-probs refer to the same sequence.

Layout (ChatML shown; any tokenizer with a chat template works)::

    <|im_start|>system\n{role prompt}<|im_end|>\n<|im_start|>user\n{task}      <- prefix ids
    \n\nMessages from other agents:                                             <- intro ids (if any)
    \n[Agent 2 (critic), round 1]:\n{sender's completion ids}                   <- one block per message
    \n\nYour turn: add only what is new, or stay silent if ...                 <- outro ids (if any)
    <|im_end|>\n<|im_start|>assistant\n                                         <- suffix ids

The chat template is rendered once per (task, agent) with a sentinel where the messages go and
split there; prefix and suffix are tokenised separately (cached).

**Bounded task prompts.** A frame (role prompt + task) must leave the reply room in the model's
context (``max_frame_tokens``: the window less ``mas.max_message_tokens``). A task longer than
:data:`CHARS_PER_TOKEN` characters per token of that room is refused before it is tokenised (a
50 MB question took 15.5 GB and an out-of-memory kill to tokenise); a shorter one is tokenised and
refused when its tokens do not fit. Refused, not truncated: the end of a question usually holds
what is asked, so a cut item would be scored as a different item (:class:`PromptTooLongError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.errors import UserError

CHARS_PER_TOKEN = 16
"""a text longer than this many characters per token of room is refused without tokenising it"""
WINDOW_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
SENTINEL = "@@AGENT_GSPO_MESSAGES@@"
INTRO = "\n\nMessages from other agents:"
OUTRO = "\n\nYour turn: add only what is new, or stay silent if you have nothing to add."


class PromptTooLongError(UserError):
    """A task whose prompt cannot fit the model's context (names the item, its size and the room)."""


def model_window(model: Any, tokenizer: Any) -> int | None:
    """The number of tokens the model can hold (prompt + reply), or None when it declares none."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for key in WINDOW_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)  # a huge sentinel when unset
    return value if isinstance(value, int) and 0 < value < 10**7 else None


def truncate_blocks(lengths: list[int], budget: int) -> list[int]:
    """Indices of the blocks kept under ``budget`` tokens, dropping the oldest first.

    ``lengths`` are block sizes in token ids, oldest first. Deterministic: blocks are dropped from
    the front until the rest fits (a single block larger than the budget is dropped too).
    """
    total = sum(lengths)
    start = 0
    while start < len(lengths) and total > budget:
        total -= lengths[start]
        start += 1
    return list(range(start, len(lengths)))


@dataclass
class PromptParts:
    """Cached ids of one (task, agent) prompt frame."""

    prefix: list[int]
    suffix: list[int]


class PromptBuilder:
    """Builds agent prompts as id lists; caches frames and headers (tokenizer calls are slow)."""

    def __init__(self, tokenizer, budget: int, allow_silence: bool = True, max_frame_tokens: int | None = None):
        self.tok = tokenizer
        self.budget = budget
        self.max_frame_tokens = max_frame_tokens
        """tokens a frame may take (None: unbounded); see the module docstring"""
        self._frames: dict[tuple[str, str], PromptParts] = {}
        self._headers: dict[tuple[int, str, int], list[int]] = {}
        self.intro = self._encode(INTRO)
        # Small models follow the last instruction they read: after the others' messages, remind the
        # agent that silence is an option (only when silence is allowed and messages were delivered).
        self.outro = self._encode(OUTRO) if allow_silence else []

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def frame(self, system: str, user: str, where: str = "task") -> PromptParts:
        """The cached frame of (``system``, ``user``); ``where`` names the item in a refusal."""
        key = (system, user)
        parts = self._frames.get(key)
        if parts is None:
            limit = self.max_frame_tokens
            if limit is not None and len(system) + len(user) > limit * CHARS_PER_TOKEN:
                raise PromptTooLongError(f"{where}: its prompt has {len(system) + len(user)} characters, more than "
                                         f"{CHARS_PER_TOKEN} per token of the {limit} the model's context leaves "
                                         "for it; refused before tokenising (items are not truncated)")
            chat = [{"role": "system", "content": system}, {"role": "user", "content": user + SENTINEL}]
            text = self.tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            if SENTINEL not in text:
                raise ValueError("chat template dropped the message placeholder; cannot frame prompts")
            before, after = text.split(SENTINEL, 1)
            parts = PromptParts(self._encode(before), self._encode(after))
            if limit is not None and len(parts.prefix) + len(parts.suffix) > limit:
                raise PromptTooLongError(f"{where}: its prompt takes {len(parts.prefix) + len(parts.suffix)} tokens, "
                                         f"at most {limit} fit (the model's context less the reply's "
                                         "mas.max_message_tokens); items are not truncated")
            self._frames[key] = parts
        return parts

    def header(self, agent_id: int, role: str, round_idx: int) -> list[int]:
        key = (agent_id, role, round_idx)
        ids = self._headers.get(key)
        if ids is None:
            ids = self._encode(f"\n[Agent {agent_id + 1} ({role}), round {round_idx + 1}]:\n")
            self._headers[key] = ids
        return ids

    def build(self, parts: PromptParts, blocks: list[list[int]]) -> tuple[list[int], list[int]]:
        """Prompt ids and the indices of ``blocks`` (oldest first) that fit the budget."""
        kept = truncate_blocks([len(b) for b in blocks], self.budget)
        ids = list(parts.prefix)
        if kept:
            ids += self.intro
            for k in kept:
                ids += blocks[k]
            ids += self.outro
        ids += parts.suffix
        return ids, kept
