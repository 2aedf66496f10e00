"""Experiment definitions (``params.yaml`` -> ``experiments.definitions``) resolved into configs.

An experiment is a list of ``section.key=value`` overrides on top of the selected profile, so the
CLI (``agent-gspo experiments run``) and DVC (``dvc exp run -S experiments.definitions...``) read
the same definitions. ``extends`` chains are flattened here (ancestor overrides first), and a
``budget_fraction`` becomes ``budget.target`` = fraction x the untrained MAS's mean tokens per
episode, read from the baselines results file in the unit the trainer's budget tracks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from components.config import Config, ConfigError, set_override
from components.errors import UserError
from components.experiments.results import BudgetInfo, ResultsFile, pooled_tokens_mean

BASELINE_SYSTEM = "mas_untrained"
"""the free-for-all MAS: the system whose token use B is a fraction of"""

SETTINGS_KEYS = ("model.name", "mas.agents", "mas.rounds", "mas.topology", "mas.max_message_tokens",
                 "mas.context_tokens", "mas.silence_marker", "eval.limit", "eval.seed", "eval.benchmarks")
"""what a budget (and every comparison in the report) assumes two experiments share"""


class ExperimentError(UserError):
    """Bad experiment selection, or a baselines file that cannot give a budget."""


@dataclass(frozen=True)
class Experiment:
    """A definition with its ``extends`` chain flattened."""

    name: str
    kind: str
    label: str
    description: str
    extends: str | None
    overrides: tuple[str, ...]
    """ancestors' overrides first, then its own (later ones win)"""
    budget_fraction: float | None
    profile: str | None = None
    """proof kind: the profile it runs under"""


def resolve(cfg: Config) -> dict[str, Experiment]:
    """All definitions of ``cfg.experiments`` in declaration order (the schema has checked the chains)."""
    defs = cfg.experiments.definitions
    out: dict[str, Experiment] = {}
    for name, d in defs.items():
        chain = [d]
        while chain[-1].extends is not None:
            chain.append(defs[chain[-1].extends])
        overrides = tuple(t for link in reversed(chain) for t in link.overrides)
        fraction = next((link.budget_fraction for link in chain if link.budget_fraction is not None), None)
        if fraction is not None and any(t.split("=", 1)[0].strip() == "budget.target" for t in overrides):
            raise ExperimentError(f"experiments.definitions.{name}: inherits budget_fraction and overrides "
                                  "budget.target; keep one of the two")
        out[name] = Experiment(name, d.kind, d.label or name, d.description, d.extends, overrides, fraction, d.profile)
    return out


def select(cfg: Config, only: Sequence[str] | None = None) -> list[Experiment]:
    """The experiments to run, in declaration order; ``only`` restricts them (unknown name: error)."""
    exps = resolve(cfg)
    if not exps:
        raise ExperimentError("experiments.definitions is empty: nothing to run (see params.yaml)")
    if only:
        unknown = [n for n in only if n not in exps]
        if unknown:
            raise ExperimentError(f"--only: unknown experiment(s) {unknown} (defined: {', '.join(exps)})")
    return [e for name, e in exps.items() if not only or name in only]


def experiment_config(base: Config, exp: Experiment, *, user_overrides: Sequence[str] = (),
                      budget_target: float | None = None) -> Config:
    """``base`` (profile applied) + the experiment's overrides + ``user_overrides`` (``--set``, they
    win) + the computed ``budget.target``; training and evaluation folders under ``runs_dir/<name>``."""
    raw: dict[str, Any] = base.model_dump(mode="json")
    where = f"experiments.definitions.{exp.name}.overrides"
    for text in exp.overrides:
        set_override(raw, text)
    for text in user_overrides:
        set_override(raw, text)
    if budget_target is not None:
        raw["budget"]["target"] = budget_target
    run_dir = Path(raw["experiments"]["runs_dir"]) / exp.name
    raw["gspo"]["out_dir"] = str(run_dir)
    raw["eval"]["out_dir"] = str(run_dir / "eval")
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        bad = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where} (profile {base.profile}): {bad}") from exc


def settings_of(cfg: Config) -> dict[str, Any]:
    """The :data:`SETTINGS_KEYS` values of ``cfg`` (stored in every results file)."""
    flat = cfg.flat()
    return {k: flat[k] for k in SETTINGS_KEYS}


def check_compatible(baseline: ResultsFile, cfg: Config, source: str) -> None:
    """Refuse a budget from a baselines file measured under other settings (a stale file)."""
    mine = settings_of(cfg)
    diff = [f"{k}: file {baseline.settings.get(k)!r}, now {mine[k]!r}" for k in SETTINGS_KEYS
            if baseline.settings.get(k) != mine[k]]
    if diff:
        raise ExperimentError(f"{source}: measured under other settings ({'; '.join(diff)}); rerun "
                              f"`agent-gspo experiments run --only {baseline.name}` with this profile")


def budget_from_baseline(baseline: ResultsFile, fraction: float, cfg: Config, source: str) -> BudgetInfo:
    """B = ``fraction`` x the untrained MAS's mean tokens per episode, in ``reward.token_measure``.

    The trainer's ``train/budget_tokens`` (what the dual controller steers) is the batch mean of
    ``episode.tokens(reward.token_measure)`` on the training questions, so the matching baseline
    figure is ``tokens_<measure>_mean`` of ``mas_untrained``, pooled over the evaluated benchmarks
    that are also training sources (``data.train_sources``, e.g. gsm8k) - the same question
    distribution - or over every evaluated benchmark when none is. Pooled = sum of tokens / items.
    """
    measure = cfg.reward.token_measure
    cells = baseline.eval.get(BASELINE_SYSTEM)
    if not cells:
        raise ExperimentError(f"{source}: no {BASELINE_SYSTEM!r} system (has: {', '.join(baseline.eval) or 'none'}); "
                              f"add it to eval.baselines and rerun `--only {baseline.name}`")
    train_benches = {s.split("/", 1)[0] for s in cfg.data.train_sources}
    benches = [b for b in cells if b in train_benches] or list(cells)
    mean = pooled_tokens_mean(cells, benches, measure)
    if mean is None or mean <= 0:
        raise ExperimentError(f"{source}: {BASELINE_SYSTEM} has no {measure} tokens on {benches}; cannot set B")
    return BudgetInfo(fraction=fraction, target=fraction * mean, measure=measure,
                      figure=f"tokens_{measure}_mean", system=BASELINE_SYSTEM, benchmarks=benches,
                      baseline_mean=mean, source=Path(source).name)
