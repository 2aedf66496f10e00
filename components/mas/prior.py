"""The silence prior: the step-0 policy samples silence in a share of its replies (exploration).

Calibrated on the first-round prompts (every agent, every fact holder) of training items, at the
sampling temperature, so the prior is the same wherever it is applied: at the start of training,
and for the "prior only" system in evaluation (the untrained model with the same prior and no RL),
which separates injected silence from learned silence. ``per_prompt`` fits on a seeded sample of
:data:`CALIBRATION_SAMPLE` items drawn from all of ``data.train_sources`` (the first items of a
list all come from its first source); ``mean_direction`` keeps the earlier choice, the first
:data:`CALIBRATION_ITEMS`, so runs made with it reproduce.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from components.config import MasConfig
from components.data.item import Item
from components.mas.engine import RolloutEngine
from components.models.silence import set_silence_prior

CALIBRATION_ITEMS = 8
"""items the ``mean_direction`` fit uses (the first of the list)"""
CALIBRATION_SAMPLE = 64
"""items the ``per_prompt`` fit uses (a seeded sample; x agents prompts)"""
CALIBRATION_SEED = 20_251_201


def calibration_items(items: Sequence[Item], method: str) -> list[Item]:
    """The training items whose first-round prompts fit the silence row for ``method``."""
    items = list(items)
    if method == "mean_direction":
        return items[:CALIBRATION_ITEMS]
    return random.Random(CALIBRATION_SEED).sample(items, min(CALIBRATION_SAMPLE, len(items)))


def apply_silence_prior(model: Any, tokenizer: Any, cfg: MasConfig, items: Sequence[Item], prior: float,
                        method: str = "mean_direction") -> float:
    """Set the silence row of ``model`` for P(silence first) ≈ ``prior`` (``model.silence_calibration``
    ``method``); returns the mean reached on the calibration prompts."""
    engine = RolloutEngine(model, tokenizer, cfg)
    prompts = engine.first_round_prompts(calibration_items(items, method))
    assert engine.silence_id is not None
    return set_silence_prior(model, prompts, engine.silence_id, prior, cfg.temperature or 1.0, method)
