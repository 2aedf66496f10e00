"""The search's sampler: TPE, seeded per trial from ``(seed, trial number)``.

Why per trial and not per process: a sampler seeded once with the configured seed draws the same
random sequence in every process, so two workers joining one study proposed identical points
(trials 0 and 1 alike, then 2 and 3), and a rerun of a finished study repeated its first trials.
Seeding each trial from the configured seed *and its trial number* fixes both without giving up
reproducibility:

* trial numbers are unique across the whole study (the storage assigns them under its lock), so
  concurrent workers -- on one host or many -- never share a seed, even when started at the same
  instant, and a resumed study's new trials (numbers above the old ones) get new seeds;
* a lone fresh run numbers its trials 0, 1, 2, ... as before, so it samples the same points each
  time it is run with the same seed (a different seed gives different points).

Alternatives considered: the number of trials in the study at join time plus a per-process
component (pid, random) also separates workers, but the per-process part makes a lone run
irreproducible, and the join-time count alone collides for workers that join together. The trial
number is that join-time count made exact per trial.

Within a trial, TPE still sees the whole study (``constant_liar`` treats other workers' running
trials as bad points), so its model is shared; only its random draws are per trial.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState


def trial_seed(seed: int | None, number: int) -> int | None:
    """The seed of trial ``number`` of a search seeded with ``seed`` (None: unseeded, random)."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"agent-gspo-search:{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def tpe(seed: int | None) -> BaseSampler:
    """The search's TPE: ``constant_liar`` keeps parallel workers away from each other's running points."""
    with warnings.catch_warnings():  # constant_liar has been "experimental" since Optuna 2.8
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


class TrialSeededSampler(BaseSampler):
    """Delegates each trial to its own sampler built by ``make(trial_seed(seed, trial.number))``."""

    def __init__(self, seed: int | None, make: Callable[[int | None], BaseSampler] = tpe) -> None:
        self.seed = seed
        self._make = make
        self._by_trial: dict[int, BaseSampler] = {}

    def _for(self, trial: FrozenTrial) -> BaseSampler:
        sampler = self._by_trial.get(trial.number)
        if sampler is None:
            sampler = self._by_trial[trial.number] = self._make(trial_seed(self.seed, trial.number))
        return sampler

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._for(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._for(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._for(trial).before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        """The trial's sampler is dropped once it has seen the trial's end (memory stays flat)."""
        sampler = self._by_trial.pop(trial.number, None) or self._make(trial_seed(self.seed, trial.number))
        sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Nothing to reseed: every trial's seed is derived from its number (Optuna calls this for n_jobs > 1)."""
