"""Log-probs of sampled tokens: the kernel every GSPO ratio is built from.

:func:`completion_logprobs` scores each packed message's completion under a model exactly as the
decoder sampled it (temperature, the silence token only first, the first ids a speaker that had to
answer could not start with), so π_old equals the behaviour policy and π_θ / π_old is 1 before an
update. Underneath, :func:`logprobs_at` is a hand-written log-softmax at selected positions
(float32, chunked, K labels sharing one log-sum-exp) and :func:`token_logprobs` its checked
``[B, T]`` interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from components.gspo import shared_prompts
from components.gspo.batching import SequenceBatch
from components.gspo.loss import GspoInputError

__all__ = ["Sampling", "completion_logprobs", "logprobs_at", "token_logprobs"]


@dataclass(frozen=True)
class Sampling:
    """How the decoder sampled the completions being scored (what it masked, at what temperature)."""

    temperature: float = 1.0
    """the sampler's temperature (<= 0: greedy, scored at 1)"""
    silence_id: int | None = None
    """the silence token, renormalised away where the decoder masked it; None: no silence token"""
    silence_from: int = 1
    """first completion position where silence was masked: 1 for a team, 0 for a lone agent"""
    first_banned: Tensor | None = None
    """[V] bool: what ``mas.must_answer``'s speaker could not start with (the decoder's mask)"""


def completion_logprobs(model: nn.Module, batch: SequenceBatch, sampling: Sampling = Sampling(),
                        share_prompts: bool = False) -> Tensor:
    """Per-token log-probs of each row's completion under ``model``: ``[B, C]`` float32 (0 under padding).

    ``sampling`` (:class:`Sampling`) says how the decoder sampled. ``temperature`` divides the
    logits as the sampler did, so π_old equals the behaviour policy that generated the messages
    (the rollout engine records log-probs at the same temperature).
    The logits are cast to float32 BEFORE the division and the log-softmax (bf16 models included):
    a bf16 division or log-sum-exp adds noise of the order of the GSPO clip range.
    ``silence_id``: the silence token may only start a reply (the decoder masks it later on), so at
    completion positions t >= 1 the distribution is renormalised without it:
    log p(y) - log(1 - p(silence)), the log-prob under the masked softmax the sampler used.
    ``silence_from`` is the first masked position: 1 for a team, 0 for a lone agent (the decoder
    never lets a lone agent be silent). The first token of a row in ``batch.no_silence`` is
    renormalised without every id of ``first_banned`` ([V] bool, the decoder's mask for those rows;
    required with them): log p(y) - log(1 - p(banned)), a log-sum-exp over those positions only.

    ``share_prompts``: prompt heads common to several rows run once and only the N scored positions
    are projected to the vocabulary (:mod:`components.gspo.shared_prompts`; same values and
    gradients up to rounding), unless the model checkpoints gradients or sharing would save too
    little. Otherwise the plain forward: the
    last ``K = W - min_r p_r + 1`` logits are kept (W = batch width); window column
    ``p_r - 1 + t - (W - K)`` predicts row r's completion token t. Only the N valid completion
    positions are scored (:func:`logprobs_at`, chunked over all rows at once),
    with the sampled id and the silence token sharing one log-sum-exp.
    """
    temperature, silence_id, silence_from, first_banned = (sampling.temperature, sampling.silence_id,
                                                           sampling.silence_from, sampling.first_banned)
    b, width = batch.input_ids.shape
    c = batch.completion_ids.shape[1]
    rows, t = (batch.completion_mask > 0).nonzero(as_tuple=True)  # [N] each
    shared = (shared_prompts.shared_head_logits(model, batch.input_ids, batch.prompt_lens, rows, t)
              if share_prompts and shared_prompts.can_share(model) else None)
    if shared is None:
        keep = width - int(batch.prompt_lens.min()) + 1
        logits = model(input_ids=batch.input_ids, logits_to_keep=keep, use_cache=False).logits  # [B, K, V]
        at_b, at_t = rows, batch.prompt_lens[rows] - 1 + t - (width - keep)  # [N] window positions
    else:
        logits = shared[None]  # [1, N, V]: position n predicts completion id t[n] of row rows[n]
        at_b, at_t = torch.zeros_like(rows), torch.arange(rows.shape[0], device=rows.device)
    temp = float(temperature) if temperature > 0 else 1.0
    labels = batch.completion_ids[rows, t][:, None]  # [N, 1]
    if silence_id is not None:
        labels = torch.cat([labels, torch.full_like(labels, silence_id)], dim=1)  # [N, 2]
    lp = logprobs_at(logits, at_b, at_t, labels, temperature=temp)  # [N, K]
    logp = lp[:, 0]
    if silence_id is not None:  # renormalise without the silence token where the decoder masked it
        masked, first = t >= silence_from, None
        if batch.no_silence is not None:
            if first_banned is None:
                raise ValueError("completion_logprobs: rows that had to speak (batch.no_silence) need "
                                 "first_banned, the decoder's mask for their first token")
            first = batch.no_silence[rows] & (t == 0)  # [N]: renormalised below, over the whole banned set
            masked = masked & ~first
        logp = logp - torch.where(masked, torch.log1p(-lp[:, 1].clamp(max=-1e-6).exp()), 0.0)
        if first_banned is not None and first is not None and bool(first.any()):
            k = first.nonzero(as_tuple=True)[0]  # [n0] positions: first tokens of rows that had to speak
            z = logits[at_b[k], at_t[k]].float() / temp  # [n0, V]
            banned = first_banned.to(z.device)[: z.shape[-1]]
            p_banned = (torch.logsumexp(z[:, banned], -1) - torch.logsumexp(z, -1)).exp()  # [n0]
            logp = logp.index_put((k,), logp[k] - torch.log1p(-p_banned.clamp(max=1 - 1e-6)))
    return torch.zeros((b, c), dtype=logp.dtype, device=logp.device).index_put((rows, t), logp)


# ----------------------------------------------------------------------------- the kernel

class _Chunking(NamedTuple):
    """How :class:`_LogprobsAt` walks the positions: ``chunk_rows`` at a time, logits / ``temperature``."""

    chunk_rows: int
    temperature: float


def _rows_at(logits: Tensor, pos_b: Tensor, pos_t: Tensor, cdt: torch.dtype, temperature: float) -> Tensor:
    """``logits[pos_b, pos_t] / temperature`` as a fresh [n, V] tensor in ``cdt`` (cast BEFORE dividing)."""
    x = logits[pos_b, pos_t].to(cdt)  # advanced indexing copies: safe to scale in place
    if temperature != 1.0:
        x.div_(temperature)
    return x


class _LogprobsAt(torch.autograd.Function):
    """log_softmax(logits / T)[label] at N selected positions, K labels each, in float32.

    Hand-written (instead of ``log_softmax(...).gather(...)`` or TRL's ``selective_log_softmax``)
    so that (a) the forward never materialises a full B·T×V float32 copy: positions are processed
    ``chunk_rows`` at a time across rows (no per-row Python loop), and only the N positions that
    have a label (never the window's prompt or padding columns); (b) nothing of size V per position
    is saved for backward except the caller's own ``logits``; (c) bf16 logits are cast to float32
    before the temperature divides them, so the log-sum-exp and the division are float32 (TRL's
    bf16 path does both in bf16); (d) K labels per position (the sampled id and the silence token)
    share one log-sum-exp.
    Backward: ∂logp_k/∂logits = (onehot(label_k) − softmax(logits/T)) / T, recomputed per chunk.
    Shapes: logits [B, T, V]; pos_b, pos_t [N]; labels [N, K]; output [N, K].
    """

    @staticmethod
    def forward(ctx, logits: Tensor, pos_b: Tensor, pos_t: Tensor, labels: Tensor,  # type: ignore[override]
                how: _Chunking) -> Tensor:
        chunk_rows, temperature = how
        cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32  # compute dtype
        n = labels.shape[0]
        out = torch.empty(labels.shape, dtype=cdt, device=logits.device)  # [N, K]
        lse = torch.empty(n, dtype=cdt, device=logits.device)  # [N]
        for s in range(0, n, chunk_rows):
            e = min(s + chunk_rows, n)
            x = _rows_at(logits, pos_b[s:e], pos_t[s:e], cdt, temperature)  # [m, V]
            lse[s:e] = torch.logsumexp(x, dim=-1)
            out[s:e] = x.gather(-1, labels[s:e]) - lse[s:e, None]
        ctx.save_for_backward(logits, pos_b, pos_t, labels, lse)
        ctx.chunk_rows, ctx.temperature = chunk_rows, temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        logits, pos_b, pos_t, labels, lse = ctx.saved_tensors
        t = ctx.temperature
        g = grad_out.to(lse.dtype)  # [N, K]
        grad = torch.zeros(logits.shape, dtype=logits.dtype, device=logits.device)  # unselected positions: 0
        for s in range(0, labels.shape[0], ctx.chunk_rows):
            e = min(s + ctx.chunk_rows, labels.shape[0])
            gs = g[s:e]
            p = _rows_at(logits, pos_b[s:e], pos_t[s:e], lse.dtype, t)
            p.sub_(lse[s:e, None]).exp_().mul_(-gs.sum(-1, keepdim=True))  # −softmax·Σ_k g_k, [m, V]
            p.scatter_add_(-1, labels[s:e], gs)
            if t != 1.0:
                p.div_(t)
            grad[pos_b[s:e], pos_t[s:e]] = p.to(logits.dtype)
        return grad, None, None, None, None


def logprobs_at(logits: Tensor, pos_b: Tensor, pos_t: Tensor, labels: Tensor, *, temperature: float = 1.0,
                chunk_rows: int = 1024) -> Tensor:
    """log softmax(logits[b, t] / temperature)[label] at selected positions (no checks; see
    :func:`token_logprobs` for a checked [B, T] interface).

    Args:
        logits: [B, T, V] any float dtype (cast to float32 chunk by chunk, then divided).
        pos_b, pos_t: [N] long, the positions to score.
        labels: [N, K] long ids in [0, V): K labels per position share one log-sum-exp.
    Returns:
        [N, K] float32 (float64 for float64 logits), differentiable w.r.t. ``logits``.
    """
    return _LogprobsAt.apply(logits, pos_b, pos_t, labels, _Chunking(chunk_rows, float(temperature)))


def token_logprobs(logits: Tensor, labels: Tensor, *, ignore_index: int = -100,
                   chunk_rows: int = 1024, temperature: float = 1.0) -> Tensor:
    """log π(label | ·) per position.

    Args:
        logits: [B, T, V] (any float dtype; computed in float32, chunk by chunk).
        labels: [B, T] integer token ids; positions equal to ``ignore_index`` give 0 and cost nothing.
        chunk_rows: positions per chunk; bounds the float32 temporary at chunk_rows × V.
        temperature: the logits are divided by it (in float32) before the log-softmax.

    Returns:
        [B, T] float32 log-probabilities (float64 for float64 logits), differentiable w.r.t. ``logits``.
    """
    if logits.dim() != 3 or labels.dim() != 2 or tuple(logits.shape[:2]) != tuple(labels.shape):
        raise GspoInputError(f"token_logprobs: need logits [B, T, V] and labels [B, T], got "
                             f"{tuple(logits.shape)} and {tuple(labels.shape)}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise GspoInputError(f"token_logprobs: labels must be integer token ids, got {labels.dtype}")
    if chunk_rows < 1:
        raise GspoInputError(f"token_logprobs: chunk_rows must be >= 1, got {chunk_rows}")
    if temperature <= 0:
        raise GspoInputError(f"token_logprobs: temperature must be > 0, got {temperature}")
    labels = labels.long()
    keep = labels != ignore_index
    v = logits.shape[-1]
    if bool(((labels[keep] < 0) | (labels[keep] >= v)).any()):
        raise GspoInputError(f"token_logprobs: label ids must lie in [0, {v}) or equal {ignore_index}")
    pos_b, pos_t = keep.nonzero(as_tuple=True)
    out = logprobs_at(logits, pos_b, pos_t, labels[pos_b, pos_t, None], temperature=temperature,
                      chunk_rows=chunk_rows)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.zeros(labels.shape, dtype=dtype, device=logits.device).index_put((pos_b, pos_t), out[:, 0])
