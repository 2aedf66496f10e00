"""The silence prior: the step-0 policy samples silence in a share of its replies (exploration).

Calibrated on the first-round prompts of the first ``CALIBRATION_ITEMS`` training items (every
agent, every fact holder), at the sampling temperature, so the prior is the same wherever it is
applied: at the start of training, and for the "prior only" system in evaluation (the untrained
model with the same prior and no RL), which separates injected silence from learned silence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.config import MasConfig
from components.data.item import Item
from components.mas.engine import RolloutEngine
from components.models.silence import set_silence_prior

CALIBRATION_ITEMS = 8


def apply_silence_prior(model: Any, tokenizer: Any, cfg: MasConfig, items: Sequence[Item], prior: float) -> float:
    """Set the silence row of ``model`` for P(silence first) ≈ ``prior``; returns the mean reached."""
    engine = RolloutEngine(model, tokenizer, cfg)
    prompts = engine.first_round_prompts(list(items)[:CALIBRATION_ITEMS])
    assert engine.silence_id is not None
    return set_silence_prior(model, prompts, engine.silence_id, prior, cfg.temperature or 1.0)
