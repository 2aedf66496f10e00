"""The silence action: one special token the policy itself samples, with a configurable prior.

Why a token of its own: written out, a marker such as ``<silent>`` is several BPE tokens, and an
untrained SmolLM2-135M emits it in about 1e-4 of its messages, so GSPO never samples silence and
can never reinforce it. As one added special token whose output row is set so that its
probability as a reply's first token is about ``prior`` (:func:`set_silence_prior`), silence is
explored by the policy's own distribution: the behaviour log-prob, π_old and π_θ all include it,
so the GSPO ratio stays exact. Silence is a first-token action only: the decoder and the trainer
both mask the token at every later position (:data:`SILENCE_FIRST_ONLY`), the same mask on both
sides.

The row is set from the final hidden states ``h_i`` at the first completion position of real
prompts (:func:`set_silence_prior`). For each prompt the wanted silence logit is
``t_i = T · (logsumexp_j≠s(z_ij / T) + log(p / (1 − p)))``, which gives it probability ``p`` at
sampling temperature ``T``. Two fits of the row ``w`` (``model.silence_calibration``):

* ``per_prompt``: ridge regression ``min ‖H w − t‖² + α‖w‖²`` (:data:`RIDGE`, relative
  to the mean ``‖h‖²``), so every calibration prompt gets about ``p``.
* ``mean_direction`` (the default; every committed run): ``w = s · d`` with ``d`` the mean
  direction and ``s`` putting the mean of ``h_i · w`` on the mean target. Silence probability is
  convex in the logit and SmolLM2's prompts spread widely along ``d``, so the realised rate is
  uneven (0.000 to 0.94 over 24 first-round prompts at ``p`` = 0.1,
  ``tests/integration/test_models_smollm2.py``).

Measured by ``bench/silence_prior.py`` on SmolLM2-135M (bf16, ``p`` = 0.1, T 0.5), on the
first-round prompts of 32 training items that neither fit used (mean / median / 10th / 90th
percentile of P(silence first); share of prompts within [p/2, 2p]):

| training questions | ``mean_direction`` | ``per_prompt`` |
|---|---|---|
| GSM8K train | 0.136 / 0.063 / 0.004 / 0.387; 0.23 | 0.144 / 0.083 / 0.026 / 0.322; 0.50 |
| MMLU val + AQuA dev | 0.022 / 0.005 / 0.000 / 0.049; 0.07 | 0.116 / 0.097 / 0.047 / 0.190; 0.78 |

Why the uneven fit stays the default: it is the one with a training result. The proof recipe
(``silence_proof``, README) learned strategic silence with it; re-run with ``per_prompt`` (one
seed) it collapsed into silence (96–100 % of messages silent from step 11, all from step 19;
held-out accuracy 0.000).

With tied input/output embeddings (SmolLM2) the input row changes too; prompts never contain the
token (role prompts describe silence in words), so that row is only read after a silent reply has
ended.

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


RIDGE = 1e-3
"""ridge strength of the ``per_prompt`` fit, times the mean squared norm of the hidden states: small
enough that calibration prompts land within ~10 % of the prior, large enough to keep the row's norm
(and so unseen prompts' rates) in check; chosen on held-out prompts (see the module docstring)."""

CALIBRATIONS = ("mean_direction", "per_prompt")


@torch.no_grad()
def set_silence_prior(model: torch.nn.Module, prompts: Sequence[Sequence[int]], token_id: int, prior: float,
                      temperature: float = 1.0, method: str = "mean_direction") -> float:
    """Set the silence row so that P(silence first) ≈ ``prior`` on ``prompts`` when sampling at
    ``temperature`` (``method``: see the module docstring); returns the mean probability reached
    on ``prompts`` (measured after setting). ``prior = 0`` zeroes the row."""
    if not 0.0 <= prior < 1.0:
        raise SilenceTokenError(f"model.silence_prior must be in [0, 1), got {prior}")
    if method not in CALIBRATIONS:
        raise SilenceTokenError(f"model.silence_calibration must be one of {', '.join(CALIBRATIONS)}, got {method!r}")
    head = model.get_output_embeddings().weight
    if prior == 0.0:
        head[token_id].zero_()
    else:
        if not prompts:
            raise SilenceTokenError("set_silence_prior needs at least one prompt to calibrate on")
        h, logits = first_token_states(model, prompts)  # [n, H], [n, V]
        logits[:, token_id] = float("-inf")
        others = torch.logsumexp(logits / temperature, dim=-1)  # [n]
        target = temperature * (others + torch.log(torch.tensor(prior / (1.0 - prior))))  # wanted h·w, [n]
        if method == "per_prompt":
            hd = h.double()  # [n, H]: solved in the dual (n x n), since n is far below H
            gram = hd @ hd.T + RIDGE * float((hd * hd).sum(1).mean()) * torch.eye(len(hd), dtype=hd.dtype,
                                                                                    device=hd.device)
            row = hd.T @ torch.linalg.solve(gram, target.double())  # [H]
        else:
            direction = h.mean(0) / h.mean(0).norm()
            row = direction * (target / (h @ direction)).mean()
        head[token_id] = row.to(head.dtype)
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
