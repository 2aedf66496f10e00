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
"""

from __future__ import annotations

from dataclasses import dataclass

SENTINEL = "@@AGENT_GSPO_MESSAGES@@"
INTRO = "\n\nMessages from other agents:"
OUTRO = "\n\nYour turn: add only what is new, or stay silent if you have nothing to add."


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

    def __init__(self, tokenizer, budget: int, allow_silence: bool = True):
        self.tok = tokenizer
        self.budget = budget
        self._frames: dict[tuple[str, str], PromptParts] = {}
        self._headers: dict[tuple[int, str, int], list[int]] = {}
        self.intro = self._encode(INTRO)
        # Small models follow the last instruction they read: after the others' messages, remind the
        # agent that silence is an option (only when silence is allowed and messages were delivered).
        self.outro = self._encode(OUTRO) if allow_silence else []

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def frame(self, system: str, user: str) -> PromptParts:
        key = (system, user)
        parts = self._frames.get(key)
        if parts is None:
            chat = [{"role": "system", "content": system}, {"role": "user", "content": user + SENTINEL}]
            text = self.tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            if SENTINEL not in text:
                raise ValueError("chat template dropped the message placeholder; cannot frame prompts")
            before, after = text.split(SENTINEL, 1)
            parts = PromptParts(self._encode(before), self._encode(after))
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
