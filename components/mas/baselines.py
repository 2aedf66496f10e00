"""Baselines as configurations of the same batched engine (so token accounting is identical).

* ``single_cot``: one agent, one round, chain-of-thought prompt, no silence option.
* ``self_consistency``: k independent lone solvers (no edges: an all-zero custom adjacency), one
  round, majority vote over their extracted answers; the k samples are one batched call.
* ``mas_untrained``: the free-for-all MAS (complete topology) with the configured agents/rounds,
  run with the untrained policy; ``mas_prior`` is the same engine over the untrained policy with
  the silence prior (the caller passes those weights, see components/evaluation/runner.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from components.config import MasConfig
from components.data.item import Item
from components.errors import UserError
from components.mas.calls import EngineOptions
from components.mas.engine import RolloutEngine
from components.mas.environment import Environment
from components.mas.records import Episode

BASELINES = ("single_cot", "self_consistency", "mas_untrained", "mas_prior")


def _with(cfg: MasConfig, **update) -> MasConfig:
    """A validated copy of ``cfg`` with ``update`` applied (model_copy would skip validation)."""
    return MasConfig.model_validate({**cfg.model_dump(), **update})


def _solo(kw: dict[str, Any], roles: list[str]) -> dict[str, Any]:
    """``kw`` with its engine options (``options``, else the defaults) made lone solvers named ``roles``."""
    options = kw.get("options") or EngineOptions()
    return {**kw, "options": replace(options, roles=tuple(roles), solo=True)}


def single_cot_engine(model, tokenizer, cfg: MasConfig, **kw) -> RolloutEngine:
    """1 agent x 1 round."""
    c = _with(cfg, agents=1, rounds=1, topology="complete", adjacency=None, aggregation="majority")
    return RolloutEngine(model, tokenizer, c, **_solo(kw, ["solver"]))


def self_consistency_engine(model, tokenizer, cfg: MasConfig, k: int = 5, **kw) -> RolloutEngine:
    """k lone solvers that never talk, majority vote (tie -> first sample)."""
    if not 1 <= k <= 16:
        raise UserError(f"self_consistency: k must be in 1..16 (eval.self_consistency_k), got {k}")
    c = _with(cfg, agents=k, rounds=1, topology="custom", adjacency=[[0] * k for _ in range(k)],
              aggregation="majority")
    return RolloutEngine(model, tokenizer, c, **_solo(kw, ["solver"] * k))


def mas_untrained_engine(model, tokenizer, cfg: MasConfig, **kw) -> RolloutEngine:
    """Free-for-all: complete topology, configured agents and rounds, majority vote."""
    c = _with(cfg, topology="complete", adjacency=None, aggregation="majority")
    return RolloutEngine(model, tokenizer, c, **kw)


_BUILDERS: dict[str, Callable[..., RolloutEngine]] = {
    "single_cot": single_cot_engine, "self_consistency": self_consistency_engine,
    "mas_untrained": mas_untrained_engine, "mas_prior": mas_untrained_engine}


def baseline_engine(name: str, model, tokenizer, cfg: MasConfig, *, k: int = 5, **kw) -> RolloutEngine:
    """Engine for a baseline by name (see :data:`BASELINES`)."""
    if name not in _BUILDERS:
        raise UserError(f"unknown baseline {name!r} (allowed: {', '.join(BASELINES)})")
    if name == "self_consistency":
        return self_consistency_engine(model, tokenizer, cfg, k=k, **kw)
    return _BUILDERS[name](model, tokenizer, cfg, **kw)


@dataclass(frozen=True)
class BaselineRun:
    """How :func:`run_baseline` plays: the sampling seed, self-consistency's k (``eval.self_consistency_k``),
    greedy decoding, and the engine's device and options."""

    seed: int
    k: int = 5
    greedy: bool = False
    device: str = "cpu"
    options: EngineOptions | None = None


def run_baseline(name: str, model, tokenizer, cfg: MasConfig, items: list[Item], run: BaselineRun) -> list[Episode]:
    """One graded episode per item with the named baseline."""
    engine = baseline_engine(name, model, tokenizer, cfg, k=run.k, device=run.device, options=run.options)
    return Environment(engine).play(items, 1, seed=run.seed, greedy=run.greedy)
