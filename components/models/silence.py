"""The silence action: one special token the policy itself samples, with a configurable prior.

Why a token of its own: written out, a marker such as ``<silent>`` is several BPE tokens, and an
untrained SmolLM2-135M emits it in about 1e-4 of its messages, so GSPO never samples silence and
can never reinforce it. As one added special token whose output row is set so that its
probability as a reply's first token is about ``prior`` (:func:`set_silence_prior`), silence is
explored by the policy's own distribution: the behaviour log-prob, π_old and π_θ all include it,
so the GSPO ratio stays exact. Silence is a first-token action only: the decoder and the trainer
both mask the token at every later position (:data:`SILENCE_FIRST_ONLY`), the same mask on both
sides.

The row is set from the final hidden states at the first completion position of real prompts:
``w = s · d`` with ``d`` their mean direction and ``s`` chosen so that the mean logit equals the
log-sum-exp of the other logits plus ``log(p / (1 - p))``. With tied input/output embeddings
(SmolLM2) the input row changes too; prompts never contain the token (role prompts describe
silence in words), so that row is only read after a silent reply has ended.

A model without the prior (``prior = 0``) gets a zero row: the token then has logit 0, far below
an instruct model's top logits (the "untrained" baselines, measured in the README).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from components.errors import UserError

SILENCE_FIRST_ONLY = True
"""the silence token is allowed as a reply's first token only (masked later, in decode and training)"""


class SilenceTokenError(UserError):
    """The silence marker cannot be made a single token, or the prior is out of range."""


def silence_token_id(tokenizer, marker: str) -> int | None:
    """Id of ``marker`` when it is already one token of ``tokenizer``, else None."""
    ids = tokenizer.encode(marker, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


@torch.no_grad()
def ensure_silence_token(model: torch.nn.Module, tokenizer, marker: str) -> int:
    """Make ``marker`` one special token of ``tokenizer`` and ``model``; returns its id.

    An existing single-token marker is left as it is (a trained policy keeps its learned row).
    Otherwise the token is added and the embeddings grow by exactly one row (no padding rows:
    an untrained row would be sampled), set to zero.
    """
    if not marker or marker != marker.strip():
        raise SilenceTokenError(f"mas.silence_marker {marker!r} must be non-empty without surrounding spaces")
    tid = silence_token_id(tokenizer, marker)
    if tid is not None:
        return tid
    tokenizer.add_special_tokens({"additional_special_tokens": [marker]}, replace_extra_special_tokens=False)
    tid = silence_token_id(tokenizer, marker)
    if tid is None:
        raise SilenceTokenError(f"tokenizer did not make {marker!r} a single token after adding it")
    if tid >= model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        model.get_input_embeddings().weight[tid].zero_()
        model.get_output_embeddings().weight[tid].zero_()
    return tid


@torch.no_grad()
def first_token_states(model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_id: int = 0,
                       chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden state ``[n, H]`` and logits ``[n, V]`` at the first completion position.

    Prompts are batched right-padded without a mask (a causal LM's real tokens never see the pads
    after them), ``chunk`` rows at a time; the output head runs on the last real position only.
    """
    device = next(model.parameters()).device
    head = model.get_output_embeddings()
    hidden, logits = [], []
    for start in range(0, len(prompts), chunk):
        rows = [list(p) for p in prompts[start:start + chunk]]
        ids = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)
        for i, p in enumerate(rows):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        out = model(input_ids=ids.to(device), output_hidden_states=True, logits_to_keep=1)
        last = torch.tensor([len(p) - 1 for p in rows], device=device)
        h = out.hidden_states[-1][torch.arange(len(rows), device=device), last]  # [b, H]
        hidden.append(h.float())
        logits.append(head(h).float())
    return torch.cat(hidden), torch.cat(logits)


@torch.no_grad()
def set_silence_prior(model: torch.nn.Module, prompts: Sequence[Sequence[int]], token_id: int, prior: float,
                      temperature: float = 1.0) -> float:
    """Set the silence row so that P(silence first) ≈ ``prior`` on ``prompts`` when sampling at
    ``temperature``; returns the mean probability reached (measured after setting). ``prior = 0``
    zeroes the row."""
    if not 0.0 <= prior < 1.0:
        raise SilenceTokenError(f"model.silence_prior must be in [0, 1), got {prior}")
    head = model.get_output_embeddings().weight
    if prior == 0.0:
        head[token_id].zero_()
    else:
        if not prompts:
            raise SilenceTokenError("set_silence_prior needs at least one prompt to calibrate on")
        h, logits = first_token_states(model, prompts)  # [n, H], [n, V]
        logits[:, token_id] = float("-inf")
        others = torch.logsumexp(logits / temperature, dim=-1)  # [n]
        direction = h.mean(0) / h.mean(0).norm()
        target = temperature * (others + torch.log(torch.tensor(prior / (1.0 - prior))))  # wanted h·w
        scale = (target / (h @ direction)).mean()
        head[token_id] = (direction * scale).to(head.dtype)
        # only the output row changed (prompts never hold the token): the states above still hold
        logits[:, token_id] = h @ head[token_id].float()
        return float(torch.softmax(logits / temperature, dim=-1)[:, token_id].mean())
    return silence_probability(model, prompts, token_id, temperature) if prompts else 0.0


@torch.no_grad()
def silence_probability(model: torch.nn.Module, prompts: Sequence[Sequence[int]], token_id: int,
                        temperature: float = 1.0) -> float:
    """Mean P(silence token | prompt) at the first completion position, sampling at ``temperature``."""
    _, logits = first_token_states(model, prompts)
    return float(torch.softmax(logits / temperature, dim=-1)[:, token_id].mean())
