"""Group-relative advantages for GSPO.

GSPO (arXiv 2507.18071) and GRPO use Â_i = (r_i − mean(r_group)) / std(r_group) over the G
responses sampled for one query. In Agent-GSPO one *episode* is a response (G episodes per
question) and each agent message of an episode is a GSPO sequence whose reward is the episode's
(or, with per-agent credit, its own shaped reward; see :mod:`components.gspo.step_batch`).
Finer grouping — per (question, agent, round), which multi-agent RL work found necessary when
roles see different prompts — is done by the caller passing finer group ids, built with
:func:`make_group_ids`.

Conventions (decided here, documented for the trainer and the README):
- std is the sample std (Bessel-corrected, ``torch.std`` default), as in TRL and verl GRPO.
- A group whose rewards are all exactly equal (including a group of one) has *zero spread*: its
  advantages are exactly 0 (no learning signal, not ±noise/floor) and it is counted.
- ``mode="none"`` is the raw reward with no baseline (useful only as an ablation).
- ``zero_spread_groups`` / ``n_groups`` are reported in every mode as a diagnostic (the share of
  questions that carry no signal), but only ``mode="group"`` zeroes those groups.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from components.errors import UserError

__all__ = ["MODES", "AdvResult", "AdvantageInputError", "group_advantages", "make_group_ids"]

MODES = ("group", "batch", "none")


class AdvantageInputError(UserError):
    """Bad rewards / group ids / indices given to the advantage functions."""


@dataclass
class AdvResult:
    """Advantages [N] (float32) plus the number of zero-spread groups out of ``n_groups``."""

    advantages: Tensor
    zero_spread_groups: int
    n_groups: int


def _group_stats(rewards: Tensor, inverse: Tensor, n_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group mean, sample std and zero-spread flag, each [n_groups] (float64 internally)."""
    r = rewards.double()
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, r) / count
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inverse, (r - mean[inverse]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))
    gmax = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, inverse, r, "amax")
    gmin = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce_(0, inverse, r, "amin")
    return mean, std, gmax == gmin


def group_advantages(rewards: Tensor, group_ids: Tensor, *, mode: str = "group", std_floor: float = 1e-6) -> AdvResult:
    """Normalise episode rewards into advantages.

    Args:
        rewards: [N] float rewards, one per episode (must be finite).
        group_ids: [N] integer group id per episode (any values; e.g. from :func:`make_group_ids`).
        mode: "group": (r − mean_g) / max(std_g, std_floor) within each group;
              "batch": (r − mean) / max(std, std_floor) over all N;
              "none": raw rewards, no baseline.
        std_floor: lower bound on the std divisor (avoids blowing up near-equal rewards).

    Returns:
        AdvResult(advantages [N] float32, zero_spread_groups, n_groups).
    """
    if mode not in MODES:
        raise AdvantageInputError(f"gspo.adv_norm: mode={mode!r} is unknown; choose one of {list(MODES)}")
    if rewards.dim() != 1 or group_ids.dim() != 1 or rewards.shape[0] != group_ids.shape[0]:
        raise AdvantageInputError(f"group_advantages: rewards and group_ids must both be [N], got "
                                  f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise AdvantageInputError(
            f"group_advantages: group_ids must be an integer tensor, got {group_ids.dtype}")
    if not (std_floor > 0):
        raise AdvantageInputError(f"gspo.adv_std_floor must be > 0, got {std_floor}")
    if not rewards.is_floating_point():
        rewards = rewards.double()
    if rewards.numel() == 0:
        return AdvResult(torch.zeros(0, dtype=torch.float32), 0, 0)
    if not bool(torch.isfinite(rewards).all()):
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten()[:5].tolist()
        raise AdvantageInputError(f"group_advantages: rewards must be finite; bad at indices {bad}")

    r = rewards.detach().cpu().double()
    _, inverse = torch.unique(group_ids.detach().cpu(), return_inverse=True)
    n_groups = int(inverse.max()) + 1
    mean, std, flat = _group_stats(r, inverse, n_groups)
    zero_spread = int(flat.sum())

    if mode == "group":
        adv = (r - mean[inverse]) / std.clamp(min=std_floor)[inverse]
        adv = adv.masked_fill(flat[inverse], 0.0)
    elif mode == "batch":
        if bool((r == r[0]).all()):
            adv = torch.zeros_like(r)
        else:
            std_all = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
            adv = (r - r.mean()) / std_all.clamp(min=std_floor)
    else:
        adv = r.clone()
    return AdvResult(adv.to(torch.float32).to(rewards.device), zero_spread, n_groups)


def make_group_ids(*keys: Sequence[Hashable]) -> Tensor:
    """[N] long group ids from parallel key columns, numbered by first appearance.

    ``make_group_ids(question_ids)`` groups per question; ``make_group_ids(qids, agent_ids,
    rounds)`` groups per (question, agent, round). Every column must have the same length N.
    """
    if not keys:
        raise AdvantageInputError("make_group_ids: give at least one key column")
    n = len(keys[0])
    for j, col in enumerate(keys):
        if len(col) != n:
            raise AdvantageInputError(
                f"make_group_ids: key column {j} has length {len(col)}, column 0 has {n}")
    table: dict[tuple[Hashable, ...], int] = {}
    ids = []
    for row in zip(*keys, strict=True):
        try:
            ids.append(table.setdefault(row, len(table)))
        except TypeError as exc:  # an unhashable key value (list, dict, ...)
            raise AdvantageInputError(
                f"make_group_ids: key values must be hashable, got row {row!r}") from exc
    return torch.tensor(ids, dtype=torch.long)
