"""GSPO policy losses, registered by name (verl style); the log-probs they take come from
:mod:`components.gspo.logprobs`.

GSPO (Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071) replaces PPO/GRPO's
per-token importance ratio by a length-normalised *sequence* ratio

    s_i(θ) = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|) = exp( 1/|y_i| · Σ_t log π_θ(y_i,t|·)/π_old(y_i,t|·) )

and maximises  J = E[ 1/G Σ_i min( s_i·A_i, clip(s_i, 1−ε_low, 1+ε_high)·A_i ) ].
GSPO-token uses  s_i,t = sg[s_i] · π_θ(y_i,t|·) / sg[π_θ(y_i,t|·)]  with per-token advantages A_i,t
and J = E[ 1/G Σ_i 1/|y_i| Σ_t min( s_i,t·A_i,t, clip(s_i,t, …)·A_i,t ) ]; its value *and*
gradient equal GSPO's when A_i,t = A_i (the paper, §4.3). The "token" level is the GRPO ratio
r_i,t = π_θ(y_i,t|·)/π_old(y_i,t|·), kept for the ablation.

All three levels go through ONE core function, :func:`gspo_loss`, which always aggregates per
sequence: mean over each sequence's own valid tokens, then mean over sequences. There is no
option that weights sequences by their length (the TRL bug class "dapo"/"bnpo" + sequence ratios,
where a long message gets proportionally more weight than the GSPO objective gives it).
Numerical guard: log-ratios are clamped to [−20, 20] before ``exp`` (as verl does); inside that
range (every realistic case) the result is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from components.config_sections import EPS_HIGH, EPS_LOW, GspoConfig
from components.errors import UserError

__all__ = [
    "LEVELS",
    "POLICY_LOSSES",
    "GspoInputError",
    "LossOutput",
    "LossSettings",
    "get_policy_loss",
    "gspo_loss",
    "register_policy_loss",
]

LEVELS = ("sequence", "sequence_token", "token")
_LOG_RATIO_CLAMP = 20.0


class GspoInputError(UserError):
    """Bad tensors or options given to a GSPO loss (shape, dtype, unknown level/loss name)."""


@dataclass
class LossOutput:
    """Result of a policy loss.

    ``loss`` is a scalar to minimise (graph attached); ``metrics`` holds floats under the
    contract names ``gspo/clip_frac_low``, ``gspo/clip_frac_high``, ``gspo/ratio_mean``,
    ``gspo/approx_kl`` (plus ``gspo/kl_ref`` when a reference policy is given).
    """

    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LossSettings:
    """The loss's options: the ratio ``level``, the clip range and the KL weight (``gspo.*``)."""

    level: str = "sequence"
    """"sequence" (GSPO), "sequence_token" (GSPO-token) or "token" (GRPO ratio); the registered losses set it"""
    eps_low: float = EPS_LOW
    """clip range [1 − eps_low, 1 + eps_high] of the ratio (paper: 3e-4, 4e-4)"""
    eps_high: float = EPS_HIGH
    kl_beta: float = 0.0
    """weight of the k3 KL penalty to the reference policy (needs ``ref_logp``)"""

    @classmethod
    def of(cls, g: GspoConfig) -> LossSettings:
        """The settings of ``gspo``: clip range and KL weight (the level is the registered loss's)."""
        return cls(eps_low=g.eps_low, eps_high=g.eps_high, kl_beta=g.kl_beta)


def _check_inputs(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                  ref_logp: Tensor | None, level: str) -> None:
    """Raise :class:`GspoInputError` naming the offending argument."""
    if level not in LEVELS:
        raise GspoInputError(f"gspo_loss: level={level!r} is unknown; choose one of {list(LEVELS)}")
    if logp.dim() != 2:
        raise GspoInputError(f"gspo_loss: logp must be [B, T], got shape {tuple(logp.shape)}")
    if not logp.is_floating_point():
        raise GspoInputError(f"gspo_loss: logp must be floating point, got {logp.dtype}")
    for name, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if t is not None and tuple(t.shape) != tuple(logp.shape):
            raise GspoInputError(
                f"gspo_loss: {name} shape {tuple(t.shape)} must equal logp shape {tuple(logp.shape)}")
    b = logp.shape[0]
    if advantages.dim() == 1:
        if advantages.shape[0] != b:
            raise GspoInputError(
                f"gspo_loss: advantages shape {tuple(advantages.shape)} must be [B]={b} or [B, T]")
    elif advantages.dim() == 2:
        if tuple(advantages.shape) != tuple(logp.shape):
            raise GspoInputError(f"gspo_loss: advantages shape {tuple(advantages.shape)} must be [B] "
                                 f"or equal logp shape {tuple(logp.shape)}")
        if level == "sequence":
            raise GspoInputError("gspo_loss: level='sequence' takes one advantage per sequence [B]; "
                                 "use level='sequence_token' for per-token advantages [B, T]")
    else:
        raise GspoInputError(f"gspo_loss: advantages must be [B] or [B, T], got {tuple(advantages.shape)}")


def _per_sequence_mean(x: Tensor, mask: Tensor, lengths: Tensor) -> Tensor:
    """[B, T] → [B]: mean of ``x`` over each row's valid tokens (0 for an empty row)."""
    return (x * mask).sum(-1) / lengths.clamp(min=1.0)


def gspo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
              settings: LossSettings = LossSettings(), ref_logp: Tensor | None = None) -> LossOutput:
    """Clipped GSPO / GSPO-token / GRPO-token policy loss, always aggregated per sequence.

    Args:
        logp: [B, T] log π_θ of the sampled tokens (requires grad).
        old_logp: [B, T] log π_old (behaviour policy); treated as a constant.
        advantages: [B] (one per sequence) or [B, T] (per token; not for ``level="sequence"``).
        mask: [B, T] 1 for valid completion tokens, 0 for padding / prompt (bool or float).
        settings: :class:`LossSettings`: ``level``; ``eps_low``, ``eps_high``, the clip range
            [1−eps_low, 1+eps_high] of the ratio; ``kl_beta``, the weight of the k3 KL penalty
            exp(ref−logp) − (ref−logp) − 1 per token.
        ref_logp: [B, T] log π_ref, needed only when ``kl_beta > 0``.

    Per token t of sequence i, with ratio ρ_i,t (s_i, s_i,t or r_i,t by level):
        ℓ_i,t = −min(ρ_i,t·A_i,t, clip(ρ_i,t, 1−eps_low, 1+eps_high)·A_i,t) + kl_beta·k3_i,t
        loss  = mean over non-empty sequences i of ( Σ_t mask·ℓ_i,t / Σ_t mask )
    Rows with no valid token are left out of the mean over sequences (TRL counts them as zero).

    Metrics (floats): ``gspo/clip_frac_low`` / ``gspo/clip_frac_high`` = fraction of sequences
    (sequence levels: mean over sequences of the fraction of their tokens) or of valid tokens
    (token level) whose ratio was clipped where the clip is active (ρ < 1−eps_low with A < 0,
    resp. ρ > 1+eps_high with A > 0); ``gspo/ratio_mean`` = mean s_i over sequences (sequence
    levels) or mean r_i,t over valid tokens (token level); ``gspo/approx_kl`` = mean over valid
    tokens of the k3 estimate of KL(π_old‖π_θ): (r − 1) − log r with r = π_θ/π_old (unbiased
    under samples from π_old, ≥ 0); ``gspo/kl_ref`` = mean k3 to the reference when given.
    """
    level, eps_low, eps_high, kl_beta = settings.level, settings.eps_low, settings.eps_high, settings.kl_beta
    _check_inputs(logp, old_logp, advantages, mask, ref_logp, level)
    if kl_beta < 0:
        raise GspoInputError(f"gspo_loss: kl_beta must be >= 0, got {kl_beta}")
    if eps_low < 0 or eps_high < 0:
        raise GspoInputError(f"gspo_loss: eps_low/eps_high must be >= 0, got {eps_low}, {eps_high}")
    if kl_beta > 0 and ref_logp is None:
        raise GspoInputError("gspo_loss: kl_beta > 0 needs ref_logp [B, T]")

    valid = mask.bool()
    if not mask.dtype == torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise GspoInputError("gspo_loss: mask must hold only 0 and 1 (weights are not supported)")
    # Padding positions may hold -inf / garbage log-probs: overwrite them (masked_fill also blocks
    # their gradient) so no NaN can leak into the loss or its gradient through a 0·inf product.
    logp = logp.masked_fill(~valid, 0.0)
    old_logp = old_logp.detach().to(logp.dtype).masked_fill(~valid, 0.0)
    mask_f = valid.to(logp.dtype)
    lengths = mask_f.sum(-1)  # [B]
    adv = advantages.detach().to(logp.dtype)
    adv = adv.unsqueeze(-1).expand_as(logp) if adv.dim() == 1 else adv  # [B, T]
    log_ratio = (logp - old_logp) * mask_f  # [B, T]; padding positions contribute nothing

    if level == "token":
        ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))  # [B, T]
    else:
        seq_log_ratio = _per_sequence_mean(log_ratio, mask_f, lengths)  # [B]
        seq_ratio = torch.exp(seq_log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))  # [B]
        if level == "sequence":
            ratio = seq_ratio.unsqueeze(-1).expand_as(logp)  # [B, T], grad flows through s_i
        else:  # sequence_token: value s_i, gradient s_i · ∇log π_θ(y_t)
            ratio = torch.exp(logp - logp.detach()) * seq_ratio.detach().unsqueeze(-1)

    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)  # [B, T]
    kl_ref: Tensor | None = None
    if ref_logp is not None:
        d = ref_logp.detach().to(logp.dtype).masked_fill(~valid, 0.0) - logp
        kl_ref = torch.exp(d) - d - 1.0  # [B, T], k3 estimator of KL(π_θ‖π_ref)
        if kl_beta > 0:
            per_token = per_token + kl_beta * kl_ref

    nonempty = lengths > 0  # [B]
    n_seq = nonempty.sum()
    per_seq = _per_sequence_mean(per_token, mask_f, lengths)  # [B]
    loss = (per_seq * nonempty).sum() / n_seq.clamp(min=1)  # stays attached to the graph if empty

    with torch.no_grad():
        r = ratio.detach()
        low = ((r < 1.0 - eps_low) & (adv < 0)).to(logp.dtype)
        high = ((r > 1.0 + eps_high) & (adv > 0)).to(logp.dtype)
        n_tok = lengths.sum().clamp(min=1.0)
        n_s = n_seq.clamp(min=1).to(logp.dtype)
        if level == "token":
            frac_low = (low * mask_f).sum() / n_tok
            frac_high = (high * mask_f).sum() / n_tok
            ratio_mean = (r * mask_f).sum() / n_tok
        else:
            frac_low = (_per_sequence_mean(low, mask_f, lengths) * nonempty).sum() / n_s
            frac_high = (_per_sequence_mean(high, mask_f, lengths) * nonempty).sum() / n_s
            ratio_mean = (seq_ratio.detach() * nonempty).sum() / n_s
        lr = log_ratio.detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        approx_kl = ((torch.exp(lr) - 1.0 - lr) * mask_f).sum() / n_tok
        names = ["gspo/clip_frac_low", "gspo/clip_frac_high", "gspo/ratio_mean", "gspo/approx_kl"]
        values = [frac_low, frac_high, ratio_mean, approx_kl]
        if kl_ref is not None:
            names.append("gspo/kl_ref")
            values.append((kl_ref.detach() * mask_f).sum() / n_tok)
        # one device→host transfer for all metrics (one sync on GPU, not five)
        metrics = dict(zip(names, torch.stack(values).float().tolist(), strict=True))
    return LossOutput(loss=loss, metrics=metrics)


# ----------------------------------------------------------------------------- registry

PolicyLoss = Callable[..., LossOutput]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register a policy loss under ``name`` (refuses to overwrite another one)."""

    def deco(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES and POLICY_LOSSES[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    """Return the loss registered as ``name``; unknown names raise a :class:`GspoInputError`."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise GspoInputError(
            f"gspo.level / policy loss {name!r} is unknown; registered: {sorted(POLICY_LOSSES)}") from None


@register_policy_loss("sequence")
def sequence_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                  settings: LossSettings = LossSettings(), ref_logp: Tensor | None = None) -> LossOutput:
    """GSPO: sequence ratio s_i, advantages [B]. See :func:`gspo_loss` for shapes and settings."""
    return gspo_loss(logp, old_logp, advantages, mask, replace(settings, level="sequence"), ref_logp)


@register_policy_loss("sequence_token")
def sequence_token_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                        settings: LossSettings = LossSettings(), ref_logp: Tensor | None = None) -> LossOutput:
    """GSPO-token: ratio sg[s_i]·π/sg[π], advantages [B] or [B, T]. See :func:`gspo_loss`."""
    return gspo_loss(logp, old_logp, advantages, mask, replace(settings, level="sequence_token"), ref_logp)


@register_policy_loss("token")
def token_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
               settings: LossSettings = LossSettings(), ref_logp: Tensor | None = None) -> LossOutput:
    """GRPO-style per-token ratio (ablation), still aggregated per sequence. See :func:`gspo_loss`."""
    return gspo_loss(logp, old_logp, advantages, mask, replace(settings, level="token"), ref_logp)
