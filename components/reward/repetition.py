"""N-gram repetition of an episode's messages: how much each message repeats what was said before.

Hand-written because no maintained library measures cross-message n-gram overlap on *token
ids* (text metrics such as BLEU/ROUGE work on re-tokenised strings, which the Episode contract
forbids: counts come from the ids the policy generated). It is a set lookup per n-gram, so
pure Python is fast enough for episodes of a few thousand tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from components.errors import UserError


class RepetitionError(UserError):
    """Bad input to the repetition measure (e.g. n < 1)."""


def _ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


def ngram_repetition(messages: list[list[int]], n: int = 3) -> list[float]:
    """Per message, the fraction of its n-gram positions whose n-gram occurred in an earlier message.

    ``messages`` are token-id lists in the order they were produced. Repeats *within* one message
    are not counted (that is fluency, not redundant communication); a message with fewer than
    ``n`` tokens scores 0. Returns one value in [0, 1] per message.

    Example (n=2): ``[[1, 2, 3], [2, 3, 4]]`` -> ``[0.0, 0.5]`` ((2,3) was said, (3,4) was not).
    """
    if not isinstance(n, int) or n < 1:
        raise RepetitionError(f"reward.repetition_ngram: n must be an integer >= 1 (got {n!r})")
    seen: set[tuple[int, ...]] = set()
    out: list[float] = []
    for ids in messages:
        grams = _ngrams(ids, n)
        if grams:
            out.append(sum(g in seen for g in grams) / len(grams))
        else:
            out.append(0.0)
        seen.update(grams)
    return out


def message_repetitions(silent: Sequence[bool], completions: Sequence[Sequence[int]], n: int = 3) -> list[float]:
    """Repetition per message of an episode; silent messages score 0 and are not 'said'.

    A silent message is never delivered, so it neither repeats anything nor can be repeated:
    only non-silent messages enter the history. Returns one value per message (silent -> 0.0).
    """
    if len(silent) != len(completions):
        raise RepetitionError(f"got {len(silent)} silent flags for {len(completions)} messages")
    spoken = [list(ids) for ids, s in zip(completions, silent, strict=True) if not s]
    values = iter(ngram_repetition(spoken, n))
    return [0.0 if s else next(values) for s in silent]


def episode_repetition(silent: Sequence[bool], completions: Sequence[Sequence[int]], n: int = 3) -> float:
    """Episode repetition: mean of :func:`message_repetitions` over non-silent messages (0 if none)."""
    per_message = message_repetitions(silent, completions, n)
    spoken = [r for r, s in zip(per_message, silent, strict=True) if not s]
    return sum(spoken) / len(spoken) if spoken else 0.0
