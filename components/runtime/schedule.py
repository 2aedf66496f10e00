"""Learning-rate schedules (constant / cosine / linear after a linear warm-up) as ``LambdaLR``.

Why hand-written instead of ``transformers.get_*_schedule_with_warmup``: those return closures
(``functools.partial``), and ``LambdaLR.state_dict()`` drops plain functions, so a resumed run
could silently use a different schedule. :class:`LrSchedule` is a small picklable callable whose
fields land in the scheduler's ``state_dict`` (and in DeepSpeed's checkpoint), and it never gives
a zero learning rate on the first update (HF's warm-up starts at 0, wasting one GSPO update).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch.optim.lr_scheduler import LambdaLR

from components.errors import UserError

ScheduleKind = Literal["constant", "cosine", "linear"]
SCHEDULES: tuple[str, ...] = ("constant", "cosine", "linear")


class ScheduleError(UserError):
    """Unknown schedule name or inconsistent step counts."""


@dataclass
class LrSchedule:
    """Multiplier of the base LR after ``step`` optimizer updates (``LambdaLR``'s ``last_epoch``).

    Warm-up: ``(step + 1) / (warmup_steps + 1)`` for ``step < warmup_steps`` (never 0).
    Then, with progress ``p = (step - warmup) / (total - warmup)`` clipped to [0, 1]:
    constant 1; linear ``1 - p``; cosine ``0.5 (1 + cos(pi p))``; both floored at ``min_ratio``.
    """

    kind: str
    """constant | cosine | linear"""
    warmup_steps: int
    """updates of linear warm-up"""
    total_steps: int
    """total optimizer updates of the run (steps x minibatches)"""
    min_ratio: float = 0.0
    """floor of the decayed multiplier"""

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ScheduleError(f"gspo.lr_schedule: unknown schedule {self.kind!r} (allowed: {', '.join(SCHEDULES)})")
        if self.warmup_steps < 0:
            raise ScheduleError(f"gspo.warmup_steps={self.warmup_steps} must be >= 0")
        if self.total_steps < 1:
            raise ScheduleError(f"total optimizer steps={self.total_steps} must be >= 1")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ScheduleError(f"min_ratio={self.min_ratio} must be in [0, 1]")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        p = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        factor = 1.0 - p if self.kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
        return max(self.min_ratio, factor)


def build_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int, total_steps: int,
                    min_ratio: float = 0.0) -> LambdaLR:
    """A ``LambdaLR`` over ``optimizer`` following :class:`LrSchedule`; step it once per update."""
    return LambdaLR(optimizer, LrSchedule(kind, warmup_steps, total_steps, min_ratio))
