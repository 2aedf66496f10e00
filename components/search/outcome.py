"""What a search trial reports, what a study run returns, and how one worker takes part:
the records :mod:`components.search.study` works with (kept apart so that it stays readable)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import optuna

from components.comparison import ItemScore
from components.config import Config
from components.search.tracking import TrackerFactory


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial (short training + dev evaluation) reports back."""

    dev_accuracy: float
    """Objective, in [0, 1]; maximised."""
    mean_tokens_per_episode: float
    """Constrained: must be <= search.max_tokens_per_episode."""
    tokens_spent: int
    """All rollout tokens the trial consumed (training + dev), charged to budget_tokens."""
    seconds: float
    """Wall-clock of the trial."""
    items: Mapping[str, Sequence[ItemScore]] | None = None
    """Per benchmark, one result per dev item: what the best trial is compared with the baseline on
    (:mod:`components.search.candidate`); None: this trial can never become the candidate."""


TrialFn = Callable[[Config, optuna.Trial], TrialOutcome]


@dataclass(frozen=True)
class SearchResult:
    """Summary over the whole study (all workers), plus why this worker stopped."""

    study_name: str
    storage: str
    """Storage URL with any password removed."""
    best_trial: int
    best_overrides: list[str]
    best_dev_accuracy: float
    best_mean_tokens_per_episode: float
    best_constraint: float
    best_feasible: bool
    """False: no trial met the token limit; the best is the least-violating one."""
    n_complete: int
    n_failed: int
    """Trials whose trial function raised (not counted toward ``trials``)."""
    tokens_spent: int
    seconds_elapsed: float
    stopped_by: str
    """``trials``, ``budget_tokens``, ``budget_seconds`` or ``failures``."""
    params_path: str
    trials_this_worker: list[int] = field(default_factory=list)
    n_interrupted: int = 0
    """Trials ended by Ctrl-C / SIGTERM or abandoned by a dead worker (not counted toward ``trials``)."""
    written: bool = False
    """True: the best trial beat the profile's parameters and ``params_path`` was (re)written."""
    verdict: str = ""
    """The paired comparison's one line (:mod:`components.search.candidate`)."""


@dataclass(frozen=True)
class Worker:
    """How this process takes part in a study; none of it changes what a trial yields."""

    storage: str | optuna.storages.BaseStorage | None = None
    """instead of ``search.storage``: another URL (a worker's ``--storage``) or an Optuna storage
    object (tests pass an ``InMemoryStorage``), which stays the caller's to close"""
    tracker_factory: TrackerFactory | None = None
    """opens this worker's parent MLflow run; each trial becomes a nested run with its overrides as params"""
    sampler: optuna.samplers.BaseSampler | None = None
    """default: TPE (``constant_liar``) seeded per trial from ``cfg.gspo.seed`` and the trial number
    (:class:`components.search.sampler.TrialSeededSampler`: concurrent workers and resumed runs
    sample new points, a lone fresh run is reproducible)"""
    reserve_tokens: int = 0
    """the per-trial token reservation used before any trial has finished (:mod:`components.search.budget`)"""
