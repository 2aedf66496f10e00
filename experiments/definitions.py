"""Experiment definitions (``params.yaml`` -> ``experiments.definitions``) resolved into configs.

An experiment is a list of ``section.key=value`` overrides on top of the selected profile, so the
CLI (``agent-gspo experiments run``) and DVC (``dvc exp run -S experiments.definitions...``) read
the same definitions. ``extends`` chains are flattened here (ancestor overrides first), and a
``budget_fraction`` becomes ``budget.fraction``: the trainer measures the untrained policy's mean
tokens per *sampled training episode* before step 1 and sets B = fraction x that, so B is in the
very measure the dual controller then tracks (not a greedy held-out figure of another run).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from components.config import Config, ConfigError, set_override
from components.errors import UserError
from experiments.results import BudgetInfo
from experiments.schema import study_section

SETTINGS_KEYS = ("model.name", "mas.agents", "mas.rounds", "mas.topology", "mas.max_message_tokens",
                 "mas.context_tokens", "mas.silence_marker", "eval.limit", "eval.seed", "eval.benchmarks")
"""what every comparison in the report assumes two experiments share"""


class ExperimentError(UserError):
    """Bad experiment selection, or a budgeted run without its budget calibration."""


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
    defs = study_section(cfg).definitions
    out: dict[str, Experiment] = {}
    for name, d in defs.items():
        chain = [d]
        while chain[-1].extends is not None:
            chain.append(defs[chain[-1].extends])
        overrides = tuple(t for link in reversed(chain) for t in link.overrides)
        fraction = next((link.budget_fraction for link in chain if link.budget_fraction is not None), None)
        if fraction is not None and any(t.split("=", 1)[0].strip() in ("budget.target", "budget.fraction")
                                        for t in overrides):
            raise ExperimentError(f"experiments.definitions.{name}: inherits budget_fraction and overrides "
                                  "budget.target or budget.fraction; keep one of the two")
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


def budget_overrides(exp: Experiment) -> list[str]:
    """``budget_fraction`` as the override it stands for, ``budget.fraction=<f>`` (none without
    one): the one place the experiment key becomes the config key, for training, the proof and
    the config an experiment records."""
    return [] if exp.budget_fraction is None else [f"budget.fraction={exp.budget_fraction}"]


def experiment_config(base: Config, exp: Experiment, *, user_overrides: Sequence[str] = ()) -> Config:
    """``base`` (profile applied) + the experiment's overrides + ``user_overrides`` (``--set``, they
    win) + ``budget.fraction`` from ``budget_fraction``; training and evaluation folders under
    ``runs_dir/<name>``."""
    raw: dict[str, Any] = base.model_dump(mode="json")
    where = f"experiments.definitions.{exp.name}.overrides"
    for text in exp.overrides:
        set_override(raw, text)
    for text in user_overrides:
        set_override(raw, text)
    for text in budget_overrides(exp):
        set_override(raw, text)
    run_dir = Path(study_section(base).runs_dir) / exp.name  # experiments.* is frozen per experiment
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


def settings_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The :data:`SETTINGS_KEYS` on which two results files' ``settings`` differ, as ``key: a vs b``."""
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in SETTINGS_KEYS if a.get(k) != b.get(k)]


def budget_from_calibration(calibration: Mapping[str, Any] | None, cfg: Config, where: str) -> BudgetInfo:
    """B as the trainer set it before step 1 (``metrics.json`` -> ``budget_calibration``): ``fraction``
    x the mean ``reward.token_measure`` tokens of the untrained policy's sampled training episodes
    (``budget.calibration_questions`` x G), the same sampling and count the dual controller tracks."""
    if not calibration:
        raise ExperimentError(f"{where}: no budget_calibration (budget.fraction={cfg.budget.fraction!r}); "
                              "the trainer measures B before step 1 only when budget.fraction is set")
    try:
        episodes = int(calibration["episodes"])
        return BudgetInfo(fraction=float(calibration["fraction"]), target=float(calibration["target"]),
                          measure=calibration["measure"], figure=f"mean of {episodes} sampled training episodes",
                          system="policy before step 1",
                          benchmarks=sorted({s.split("/", 1)[0] for s in cfg.data.train_sources}),
                          baseline_mean=float(calibration["untrained_mean"]), source="budget calibration")
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise ExperimentError(f"{where}: budget_calibration is malformed ({exc})") from exc


def read_calibration(run_dir: str | Path) -> dict[str, Any] | None:
    """The trainer's ``budget_calibration`` from ``<run_dir>/metrics.json`` (None: no budget.fraction)."""
    path = Path(run_dir) / "metrics.json"
    return json.loads(path.read_text()).get("budget_calibration") if path.is_file() else None
